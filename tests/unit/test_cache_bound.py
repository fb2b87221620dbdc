"""The parameter cache's bound follows the weights the app has loaded (at least 128 MiB, at most
TSE_PARAMS_CACHE_MB), so a server on small models does not keep 640 MiB of transformed copies."""

from __future__ import annotations

import torch

from perm_core import param_cache


def test_the_bound_follows_the_loaded_weights_within_its_limits():
    cache = param_cache.TensorCache(max_bytes=param_cache.CACHE_BYTES)
    for i in range(4):
        cache.put(i, torch.zeros(16 * 2**20, dtype=torch.uint8))  # 64 MiB in all
    assert param_cache.fit_bound_to_models(10, cache) == param_cache.MIN_CACHE_BYTES
    assert param_cache.fit_bound_to_models(300 * 2**20, cache) == 300 * 2**20
    assert param_cache.fit_bound_to_models(10 * 2**30, cache) == param_cache.CACHE_BYTES
    assert cache.bytes == 64 * 2**20
    cache.max_bytes = 2**40
    cache.put("big", torch.zeros(100 * 2**20, dtype=torch.uint8))
    param_cache.fit_bound_to_models(10, cache)  # lowered under what it holds: the oldest go at once
    assert cache.bytes <= param_cache.MIN_CACHE_BYTES and cache.get("big") is not None and cache.get(0) is None


def test_loading_a_model_in_the_app_fits_the_bound():
    from ui import resources

    saved = param_cache.TENSORS.max_bytes
    try:
        loaded = resources.shared_model("digits-vit")
        own = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
        assert resources._loaded_bytes[("digits-vit", "float32")] == own > 0
        expected = min(param_cache.CACHE_BYTES, max(param_cache.MIN_CACHE_BYTES, sum(resources._loaded_bytes.values())))
        assert param_cache.TENSORS.max_bytes == expected
    finally:
        param_cache.TENSORS.max_bytes = saved


def test_the_app_freezes_its_long_lived_objects_so_the_collection_after_each_run_is_cheap():
    import gc

    from ui import resources

    resources.keep_out_of_gc()
    assert gc.get_freeze_count() > 10_000  # torch, transformers, streamlit and the loaded models
    garbage = []
    garbage.append(garbage)  # a cycle made after the freeze is still collected
    del garbage
    assert gc.collect() >= 1
