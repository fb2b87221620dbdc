"""Resident memory of Explore's compute under many sessions, without Streamlit: N threads (sessions) change the
channels and tokens keys of digits-vit, dinov2-s and minilm in turn, with the app's cache bounds and run slots.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/explore_threads_memory.py [--threads 30] [--seconds 30]
        [--trim]

Each thread runs the key change (Exploration.run) and its MLP view in one of its model's two run slots, keeps the
result in a byte-bounded results cache as the app does, then waits 0.5-1 s. --trim: each thread then calls
ui.runtime.housekeeping.give_back_freed_memory, as each app run does. Reports the runs done, the peak resident memory
(sampled every 0.2 s), the resident memory at the end, and after a final collection and malloc_trim: the gap
between the last two is memory glibc held for reuse, not live data.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perm_core.explore.exploration import Exploration  # noqa: E402
from perm_core.explore.mlp_view import mlp_view  # noqa: E402
from perm_core.fast.param_cache import TENSORS, TensorCache, fit_bound_to_models  # noqa: E402
from perm_core.models.defaults import default_inputs  # noqa: E402
from perm_core.models.registry import load_model  # noqa: E402
from perm_core.models.zoo import DEFAULT_IMAGE_MODEL, DEFAULT_PHOTO_MODEL, DEFAULT_TEXT_MODEL  # noqa: E402
from perm_core.run import malloc  # noqa: E402

MODELS = (DEFAULT_IMAGE_MODEL, DEFAULT_PHOTO_MODEL, DEFAULT_TEXT_MODEL)


def resident_gib() -> float:
    return int(Path(f"/proc/{os.getpid()}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--trim", action="store_true", help="give freed memory back after each run, as the app")
    args = parser.parse_args()
    from ui.runtime import give_back_freed_memory

    loaded = {name: load_model(name) for name in MODELS}
    fit_bound_to_models(sum(p.numel() * p.element_size() for m in loaded.values() for p in m.model.parameters()))
    explorations = {name: Exploration(m.model, default_inputs(m), model_id=name) for name, m in loaded.items()}
    results = TensorCache(192 * 2**20)  # ui.runtime's default
    slots = {name: threading.BoundedSemaphore(2) for name in MODELS}  # ui.runtime's TSE_CONCURRENT_RUNS
    print(f"loaded: {resident_gib():.2f} GiB resident; parameter cache bound {TENSORS.max_bytes / 2**20:.0f} MiB")
    stop_at = time.time() + args.seconds
    runs, peak = [0], [resident_gib()]

    def session(index: int) -> None:
        name, rng = MODELS[index % len(MODELS)], random.Random(index)
        explorer = explorations[name]
        while time.time() < stop_at:
            keys = {"channels": rng.randrange(10**6), "tokens": rng.randrange(10**6)}
            with slots[name]:
                result = explorer.run(keys)
                params, _ = explorer.params_for(result.scramble, keys, None)
                mlp_view(explorer, result, params, explorer.geometry.n_layers - 1)
                del params
            results.put((name, tuple(keys.items())), result)
            del result
            runs[0] += 1
            if args.trim:
                give_back_freed_memory()
            time.sleep(rng.uniform(0.5, 1.0))

    def sample() -> None:
        while time.time() < stop_at + 1:
            peak[0] = max(peak[0], resident_gib())
            time.sleep(0.2)

    threads = [threading.Thread(target=session, args=(i,)) for i in range(args.threads)]
    threads.append(threading.Thread(target=sample))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    at_end = resident_gib()
    gc.collect()
    malloc.trim()
    print(f"{args.threads} threads, {args.seconds:.0f} s, trim after each run: {args.trim}: {runs[0]} runs; "
          f"peak {peak[0]:.2f} GiB, at the end {at_end:.2f} GiB, after collecting and trimming "
          f"{resident_gib():.2f} GiB (caches: parameters {TENSORS.bytes / 2**20:.0f} MiB, "
          f"results {results.bytes / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
