"""What a key change costs on real-size models, as a ratio to one bare forward, measured in one process.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/key_change.py [--models a,b] [--repeats 3] [--check] [--clock cpu]

bare        the stock model as the zoo loads it (no traces), same dtype and input: the unit
fresh       every symmetry on, every key new (tensor cache cleared): element, parameters, traced
            scrambled forward, un-scrambling and comparing, i.e. Exploration.run (the model's graph for this
            input already traced: the run that traces it, the second on an input, is reported apart)
one key     the same with one key changed while the others stay (mlp; tokens): only the tensors that
            key reaches are rebuilt
floor       1 + the time to copy (clone) every parameter the case must write, over the bare forward: what the
            case would cost if building the transformed tensors were a plain copy and un-scrambling and comparing
            were free (a transformed set is new memory; the traced forward is at least a bare one)
cache       the bytes the shared tensor cache (perm_core.fast.param_cache) holds at the end, against its bound
check       (--check) `check` in float64, every symmetry both directions and every control (the float64 model
            already loaded; its load is reported apart), against a bare float32 forward; freed memory is kept
            as the CLI keeps it (perm_core.run.malloc), and from then on for every later model of the run too.
            Its floor: the check's scrambled runs plus the
            original, each at least one float64 forward and backward of the stock model (nothing recorded),
            against the same bare float32 forward
parts       below each model: a fresh key's parts (its keys drawn, its parameters built, the traced forward,
            comparing) in bare forwards; the key changes over their floors plus what the design adds that the
            floor leaves out; and the check's parts in float64 forward+backward passes
Text models run on 128 tokens, image models on one 224x224 image. Timings are medians; each ratio is
the median over repeats of one timed case divided by the mean of the bare forwards just before and after
it, because timings here swing by several times while other work runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from perm_core.engine.spec import Scramble  # noqa: E402
from perm_core.engine.symmetries import SYMMETRIES  # noqa: E402
from perm_core.engine.tokens import model_inputs  # noqa: E402
from perm_core.explore.exploration import Exploration  # noqa: E402
from perm_core.families import family_of  # noqa: E402
from perm_core.fast.graph_forward import fits_a_graph  # noqa: E402
from perm_core.fast.param_cache import TENSORS  # noqa: E402
from perm_core.models.registry import load_model  # noqa: E402
from perm_core.models.zoo import DINOV2_S, GEMMA3, SMOLLM2  # noqa: E402
from perm_core.run.malloc import keep_freed_memory  # noqa: E402
from perm_core.verify.check import check  # noqa: E402

MODELS = ("random:vit-base", "random:bert-base", "random:gpt2-base", SMOLLM2.name, GEMMA3.name, DINOV2_S.name)
SEQ_LEN = 128
# Issue 32's goals: each case's time at most this many times its own floor
GOALS_OVER_FLOOR = {"fresh": 1.3, "mlp_key": 1.15, "tokens_key": 1.15, "check": 1.5}


# --clock cpu: the process's CPU time, which other work on a shared machine inflates far less than wall time
CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCK["wall"]


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def inputs_for(loaded) -> dict:
    geometry = family_of(loaded.model).geometry(loaded.model.config)
    if geometry.input_kind == "image":
        size = loaded.image_size or 224
        return {"pixel_values": torch.randn(1, loaded.image_channels or 3, size, size, generator=torch.Generator()
                                            .manual_seed(0))}
    vocab = loaded.model.config.vocab_size
    return {"input_ids": torch.randint(0, vocab, (1, SEQ_LEN), generator=torch.Generator().manual_seed(0))}


def measure(name: str, repeats: int, with_check: bool) -> dict:
    """Each timed case runs between two bare forwards and is divided by their mean: on a shared machine the
    load drifts by several times within a minute, and a ratio of neighbours survives it where a ratio of
    medians taken minutes apart does not."""
    loaded = load_model(name)
    inputs = inputs_for(loaded)
    explorer = Exploration(loaded.model, inputs, model_id=name)
    bare_kwargs = model_inputs(inputs, explorer.geometry, Scramble(), explorer.subject.dtype)
    counter = iter(range(10_000, 20_000))
    base = {s: 7 for s in SYMMETRIES}

    def bare():
        with torch.no_grad():
            loaded.model(**bare_kwargs)

    fresh_parts = []  # per timed fresh run: its own parts (Exploration.run's seconds)

    def fresh():
        TENSORS.clear()
        k = next(counter)
        result = explorer.run({s: k for s in SYMMETRIES})
        fresh_parts.append(result.seconds)
        return result

    def change(symmetry):
        return lambda: explorer.run({**base, symmetry: next(counter)})

    cases = {"fresh": fresh, "mlp_key": change("mlp"), "tokens_key": change("tokens")}
    bare()
    explorer.run(base)
    # The second run on an input traces its graph (perm_core.fast.graph_forward): once per model and input, not
    # per key, so it is timed apart and kept out of every case below.
    started = clock()
    explorer.run({s: 8 for s in SYMMETRIES})
    first_graph_s = clock() - started
    written = written_by_case(explorer, base)
    for case, names in written.items():
        originals = [explorer.subject.params[n] for n in names]
        cases[f"{case}_copy"] = lambda originals=originals: [t.clone() for t in originals]
    ratios = {case: [] for case in cases}
    seconds = {case: [] for case in (*cases, "bare")}
    for _ in range(repeats):
        for case, run in cases.items():
            if case in ("mlp_key", "tokens_key"):
                explorer.run(base)  # warm: every tensor of `base` cached, as after the previous key change
            before = median_time(bare, 1)
            took = median_time(run, 1)
            after = median_time(bare, 1)
            ratios[case].append(took / ((before + after) / 2))
            seconds[case].append(took)
            seconds["bare"] += [before, after]
    row = {"model": name, "bare_s": statistics.median(seconds["bare"]), "tracing_run_s": first_graph_s}
    for case in cases:
        row[f"{case}_s"] = statistics.median(seconds[case])
        row[f"{case}_ratio"] = statistics.median(ratios[case])
    for case in written:
        row[f"{case}_floor"] = 1 + row.pop(f"{case}_copy_ratio")
    row["cache_mb"] = TENSORS.bytes / 2**20
    row["packs"] = fits_a_graph(explorer.subject.params)
    # A fresh key's parts: drawing its keys (apart, on new keys), building its parameters (the keys included),
    # the traced forward and un-scrambling and comparing, each over the bare forward
    keys_s = median_time(lambda: explorer.scramble_for({s: next(counter) for s in SYMMETRIES}), max(repeats, 3))
    parts = {part: statistics.median(p[part] for p in fresh_parts[-repeats:]) / row["bare_s"]
             for part in ("params", "trace", "compare")}
    row["fresh_parts"] = {"keys": keys_s / row["bare_s"], "keys+params": parts.pop("params"), **parts}
    row["passed"] = explorer.run({s: next(counter) for s in SYMMETRIES}).passed
    if with_check:
        keep_freed_memory()  # as the CLI does; from here on for the whole process
        loading = time.perf_counter()
        model64 = load_model(name, dtype=torch.float64).model
        started = time.perf_counter()
        row["check_load_s"] = started - loading  # reported apart: loading the float64 copy is not a pass of the check
        report = check(model64, inputs, key=1, model_name=name)
        row["check_s"], row["check_passed"] = time.perf_counter() - started, report.passed
        kwargs64 = model_inputs(inputs, explorer.geometry, Scramble(), torch.float64)

        def forward_backward():  # the stock model, nothing recorded: the least one direction-pair can cost
            output = model64(**kwargs64)
            output[0].sum().backward()
            model64.zero_grad(set_to_none=True)

        forward_backward()
        passes = 1 + len({c.symmetry for c in report.checks if c.note == ""})  # the original and each step
        pass_s = median_time(forward_backward, 3)
        row["check_floor"] = passes * pass_s / row["bare_s"]
        row["check_passes"] = passes
        # The check's parts in float64 passes: the original and each step's run (each one pass of the floor), and
        # what the floor leaves out: the oracle's stock forward and the negative controls
        row["check_parts"] = {part: seconds / pass_s for part, seconds in report.seconds.items()}
    return row


def written_by_case(explorer: Exploration, base: dict) -> dict[str, list[str]]:
    """The parameters each case must write anew: every moved one for fresh keys, those whose transformed tensor
    differs between `base` and the changed key for one key."""
    subject = explorer.subject

    def params(keys):
        return explorer.params_for(explorer.scramble_for(keys)[0], keys, None)[0]

    first = params(base)
    written = {"fresh": [n for n, t in first.items() if t is not subject.params[n]]}
    for case, symmetry in (("mlp_key", "mlp"), ("tokens_key", "tokens")):
        other = params({**base, symmetry: base[symmetry] + 1})
        written[case] = [n for n, t in other.items() if not torch.equal(t, first[n])]
    return written


def against_floors(row: dict) -> str:
    """Each case's ratio over its floor, against issue 32's goal."""
    parts = []
    for case, goal in GOALS_OVER_FLOOR.items():
        if f"{case}_floor" not in row:
            continue
        ratio = (row["check_s"] / row["bare_s"] if case == "check" else row[f"{case}_ratio"]) / row[f"{case}_floor"]
        verdict = "met" if ratio <= goal else "NOT met"
        parts.append(f"{case.replace('_', ' ')} {ratio:.2f}x (goal <= {goal}x: {verdict})")
    return f"  {row['model']} against its floors: " + ", ".join(parts)


def with_design_costs(row: dict) -> str:
    """Each key change's ratio over its floor plus what the design adds to it and the floor leaves out: a model
    with a graph packs every weight into the graph's flat buffers on every run (one more copy of all of them,
    perm_core.fast.graph_forward), and a fresh key also draws its keys and compares what it traced."""
    pack = row["fresh_floor"] - 1 if row["packs"] else 0.0
    extra = {"fresh": pack + row["fresh_parts"]["keys"] + row["fresh_parts"]["compare"],
             "mlp_key": pack, "tokens_key": pack}
    packed = f"a packed copy of every weight {pack:.2f}, " if pack else "no graph, "
    return (f"    counting what the design adds ({packed}and for a fresh key its keys and comparing): " + ", ".join(
                f"{case.replace('_', ' ')} {row[f'{case}_ratio'] / (row[f'{case}_floor'] + add):.2f}x"
                for case, add in extra.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--clock", choices=sorted(CLOCK), default="wall")
    args = parser.parse_args()
    global clock
    clock = CLOCK[args.clock]
    print(f"{'model':<18} {'bare':>7} {'fresh':>7} {'ratio':>6} {'floor':>6} {'mlp key':>8} {'ratio':>6} "
          f"{'floor':>6} {'tok key':>8} {'ratio':>6} {'floor':>6} {'check/bare':>10} {'floor':>6} {'cache':>8}  "
          "verdict", flush=True)
    for name in args.models.split(","):
        r = measure(name, args.repeats, args.check)
        check_ratio = (f"{r['check_s'] / r['bare_s']:>10.1f} {r['check_floor']:>6.1f}" if "check_s" in r
                       else f"{'-':>10} {'-':>6}")
        print(f"{r['model']:<18} {r['bare_s']:>6.3f}s {r['fresh_s']:>6.3f}s {r['fresh_ratio']:>6.2f} "
              f"{r['fresh_floor']:>6.2f} {r['mlp_key_s']:>7.3f}s {r['mlp_key_ratio']:>6.2f} {r['mlp_key_floor']:>6.2f} "
              f"{r['tokens_key_s']:>7.3f}s {r['tokens_key_ratio']:>6.2f} {r['tokens_key_floor']:>6.2f} "
              f"{check_ratio} {r['cache_mb']:>6.0f}MB  "
              f"{'pass' if r['passed'] else 'FAIL'}"
              + (f", check {'passed' if r['check_passed'] else 'FAILED'} in {r['check_s']:.1f} s "
                 f"(float64 load {r['check_load_s']:.1f} s apart)" if "check_s" in r else ""), flush=True)
        print(against_floors(r) + f"; the run that traced the graph: {r['tracing_run_s']:.2f} s "
              f"({r['tracing_run_s'] / r['bare_s']:.1f}x the bare forward)", flush=True)
        print(with_design_costs(r), flush=True)
        print("    fresh key's parts, in bare forwards: " + ", ".join(
            f"{part} {value:.2f}" for part, value in r["fresh_parts"].items())
              + f" (the floor: 1 + a copy {r['fresh_floor'] - 1:.2f})", flush=True)
        if "check_parts" in r:
            print(f"    check's parts, in float64 forward+backward passes (the floor counts {r['check_passes']}): "
                  + ", ".join(f"{part} {value:.2f}" for part, value in r["check_parts"].items()), flush=True)


if __name__ == "__main__":
    main()
