"""The parameter cache's bound follows the weights the app has loaded (at least 128 MiB, at most
TSE_PARAMS_CACHE_MB), so a server on small models does not keep 640 MiB of transformed copies."""

from __future__ import annotations

import torch

from perm_core.fast import param_cache


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
    from ui.runtime import models

    saved = param_cache.TENSORS.max_bytes
    try:
        loaded = models.shared_model("digits-vit")
        own = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
        assert models._loaded_bytes[("digits-vit", "float32")] == own > 0
        expected = min(param_cache.CACHE_BYTES, max(param_cache.MIN_CACHE_BYTES, sum(models._loaded_bytes.values())))
        assert param_cache.TENSORS.max_bytes == expected
    finally:
        param_cache.TENSORS.max_bytes = saved


def test_the_app_freezes_its_long_lived_objects_so_the_collection_after_each_run_is_cheap():
    import gc

    from ui.runtime import models

    models.keep_out_of_gc()
    assert gc.get_freeze_count() > 10_000  # torch, transformers, streamlit and the loaded models
    garbage = []
    garbage.append(garbage)  # a cycle made after the freeze is still collected
    del garbage
    assert gc.collect() >= 1


def test_explore_runs_at_most_two_of_a_model_at_once_and_a_waiting_session_reuses_what_the_one_ahead_computed():
    import threading
    import time

    from ui.runtime import budget, runs

    cache = param_cache.TensorCache(max_bytes=2**20)
    running, most, calls, lock, two_in = [0], [0], [], threading.Lock(), threading.Event()

    def work(key):
        def run():
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
                calls.append(key)
                if running[0] == 2:
                    two_in.set()
            two_in.wait(5)  # the first run stays in until a second is: the cap is reached whatever the scheduler does
            time.sleep(0.01 if key == 1 else 0.2)  # the shared link's run ends long before the others
            with lock:
                running[0] -= 1
            return torch.full((4,), float(key))
        return runs._computed_once(cache, ("a model", key), run)

    keys = [1, 2, 3, 4, 5, 1, 1, 1]  # five different runs; three more sessions on the first one's link
    threads = [threading.Thread(target=work, args=(k,)) for k in keys]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most[0] == 2
    assert sorted(calls) == [1, 2, 3, 4, 5]
    assert all(torch.equal(cache.get(("a model", k)), torch.full((4,), float(k))) for k in range(1, 6))
    assert budget.model_slot("another model") is not budget.model_slot("a model")  # models never queue together


def test_other_pages_run_at_most_two_at_once_process_wide_and_a_failed_run_frees_its_slot():
    import threading
    import time

    import pytest

    from ui.runtime import budget, runs

    running, most, lock, two_in = [0], [0], threading.Lock(), threading.Event()

    def work(page, key):
        def run():
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
                if running[0] == 2:
                    two_in.set()
            two_in.wait(5)  # as above: a second run is in before the first leaves, however slow the threads start
            time.sleep(0.1)
            with lock:
                running[0] -= 1
            return torch.full((2,), float(key))
        with runs.page_runs() as page_results:
            result = page_results.result(runs.PageRequest(page, ("slot test", key)), run)
            assert torch.equal(result, torch.full((2,), float(key)))

    threads = [threading.Thread(target=work, args=(page, key)) for key in range(3)
               for page in ("check-like", "rotation-like")]  # six runs of two pages and several "models"
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most[0] == budget._PAGE_RUNS == 2

    def fail():
        raise RuntimeError("a run that fails")

    for _ in range(budget._PAGE_RUNS + 1):  # each failure gives its slot back, or the third would wait forever
        with pytest.raises(RuntimeError), runs.page_runs() as page_results:
            page_results.result(runs.PageRequest("failing", ("slot test",)), fail)
    assert budget._page_slots.acquire(blocking=False)
    budget._page_slots.release()


def test_the_app_gives_freed_memory_back_to_the_system_at_most_once_a_second():
    """glibc keeps what torch frees among the chunks still alive; malloc_trim returns those pages. Here nine
    in ten 100 kB tensors are freed: their pages stay resident until the trim."""
    import os
    import threading
    import time

    from ui.runtime import housekeeping

    def resident_anon_mib() -> float:
        for line in open(f"/proc/{os.getpid()}/status"):
            if line.startswith("RssAnon"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no RssAnon")

    kept = []

    def fragment():
        dropped = []
        for i in range(2000):
            (kept if i % 10 == 0 else dropped).append(torch.ones(25_000))
        del dropped

    worker = threading.Thread(target=fragment)
    worker.start()
    worker.join()
    time.sleep(1.05)  # past any other test's trim
    before = resident_anon_mib()
    assert housekeeping.give_back_freed_memory()
    assert before - resident_anon_mib() > 100  # of the 172 MiB freed
    assert not housekeeping.give_back_freed_memory()  # again at once: skipped
    assert len(kept) == 200 and all(float(t[0]) == 1.0 for t in kept)  # live tensors untouched
