"""What a key change costs, as a ratio to a bare forward pass, for random models of real size.

    python benchmarks/engine_bench.py [--repeats 3] [--families vit,bert,gpt2]

Per model, in one process: the bare forward (stock model, no traces), building the transformed
parameter dict (channels + heads + mlp keys), and the transformed forward with every trace recorded
(hidden states, attention maps, outputs). The ratio is (build + traced forward) / bare forward.
"""

from __future__ import annotations

import argparse
import time

import torch

from perm_core.families import geometry_of
from perm_core.models.random_models import build_random_model
from perm_core.verify.subject import Subject

SEQ_LEN = 128


def best_of(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def inputs_for(model) -> dict:
    if geometry_of(model).input_kind == "image":
        size = model.config.image_size
        return {"pixel_values": torch.randn(1, model.config.num_channels, size, size)}
    return {"input_ids": torch.randint(0, model.config.vocab_size, (1, SEQ_LEN))}


def bench(family: str, repeats: int) -> dict:
    model, _ = build_random_model(family, size="base")
    inputs = inputs_for(model)
    subject = Subject(model, inputs)
    keys = {"channels": 11, "heads": 12, "mlp": 13}
    with torch.no_grad():
        model(**inputs)  # warm-up
        bare = best_of(repeats, lambda: model(**inputs))
        scramble = subject.build(keys)
        build = best_of(repeats, lambda: subject.transformed_params(scramble))
        params = subject.transformed_params(scramble)
        traced = best_of(repeats, lambda: subject.trace(scramble, params=params))
    return {"model": f"random:{family}-base", "params_M": sum(p.numel() for p in model.parameters()) / 1e6,
            "bare_s": bare, "build_s": build, "traced_s": traced, "ratio": (build + traced) / bare}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--families", default="vit,bert,gpt2")
    args = parser.parse_args()
    print(f"torch threads: {torch.get_num_threads()}")
    print(f"{'model':<20} {'params':>8} {'bare fwd':>9} {'build':>8} {'traced':>8} {'ratio':>6}")
    for family in args.families.split(","):
        r = bench(family, args.repeats)
        print(f"{r['model']:<20} {r['params_M']:>7.1f}M {r['bare_s']:>8.3f}s {r['build_s']:>7.3f}s "
              f"{r['traced_s']:>7.3f}s {r['ratio']:>6.2f}")


if __name__ == "__main__":
    main()
