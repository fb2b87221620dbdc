"""The streamed check in time and memory: a 1.1B Llama-shaped checkpoint, and two zoo models against their
whole-model checks.

    python benchmarks/make_llama_1b.py /tmp/tse-llama-1b
    python benchmarks/stream_check.py [--llama /tmp/tse-llama-1b] [--models smollm2-135m,gemma3-270m] [--json OUT]

The 1.1B checkpoint: `check DIR --stream --dtype float64`, its wall time as a ratio to one bare float32 forward of
the same model on the same input (the check's default: 12 token ids drawn from the vocabulary). The bare forward
is plain transformers (from_pretrained in float32, its default attention) with the whole model loaded, which fits
here in float32; it is timed after one warm-up forward, median of three, load time apart. Each zoo model:
`check NAME --dtype float64` whole and `--stream`, times and verdicts side by side.

Every command runs in a process of its own. Peak resident memory is that process's own high-water mark (wait4's
ru_maxrss: interpreter, torch and transformers included); a streamed report also gives what the check held above
the resident memory it started with, and its bound. Timings swing with other work on the machine: compare ratios
taken in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from perm_core.models.zoo import GEMMA3, SMOLLM2  # noqa: E402

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}

BARE_FORWARD = """
import json, statistics, sys, time, torch, transformers as hf
from perm_core.models.defaults import default_inputs
from perm_core.cli._streamed import loaded_stand_in, streamed_model
started = time.perf_counter()
model = hf.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
loaded_s = time.perf_counter() - started
ids = default_inputs(loaded_stand_in(streamed_model(sys.argv[1], torch.float32), sys.argv[1]))["input_ids"]
times = []
with torch.no_grad():
    for _ in range(4):
        started = time.perf_counter()
        model(input_ids=ids)
        times.append(time.perf_counter() - started)
print(json.dumps({"load_s": loaded_s, "forward_s": statistics.median(times[1:]), "tokens": ids.shape[-1]}))
"""


def measured(command: list[str]) -> dict:
    """Run a command in its own process: wall seconds, its peak resident bytes, exit status, stdout."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=err, env=ENV, cwd=ROOT)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        return {"seconds": seconds, "peak_rss_bytes": usage.ru_maxrss * 1024,
                "status": os.waitstatus_to_exitcode(status), "stdout": out.read(), "stderr_tail": err.read()[-400:]}


def check(model: str, stream: bool) -> dict:
    command = [sys.executable, "-m", "perm_core", "check", model, "--dtype", "float64", "--json"]
    result = measured(command + (["--stream"] if stream else []))
    report = json.loads(result.pop("stdout")) if result["status"] in (0, 1) else None
    result["command"] = " ".join(["python", *command[1:]] + (["--stream"] if stream else []))
    if report is not None:
        result["passed"] = report["passed"]
        result["verdicts"] = [(c["symmetry"], c["direction"], c["passed"]) for c in report["checks"]]
        result["controls_broken"] = sum(c["broken"] for c in report["controls"])
        result["controls"] = len(report["controls"])
        if "streamed" in report:
            result["memory"] = report["streamed"]["memory"]
            # the streamed check resets the kernel's high-water mark at each stage, and wait4's peak with it: the
            # process's peak is the largest of its stages' marks
            result["peak_rss_bytes"] = max(result["peak_rss_bytes"], result["memory"]["peak_rss_bytes"] or 0)
    return result


def gib(n) -> str:
    return "-" if n is None else f"{n / 2**30:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama", default="/tmp/tse-llama-1b", help="written by benchmarks/make_llama_1b.py")
    parser.add_argument("--models", default=",".join((SMOLLM2.name, GEMMA3.name)))
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    results = {}
    if args.llama and Path(args.llama).is_dir():
        bare = measured([sys.executable, "-c", BARE_FORWARD, args.llama])
        results["llama-1.1b"] = {"bare_forward": {**json.loads(bare.pop("stdout")), **bare},
                                 "streamed": check(args.llama, stream=True)}
    for name in filter(None, args.models.split(",")):
        # converted once from its GGUF into the safetensors cache before anything is timed
        measured([sys.executable, "-c", f"from perm_core.models.registry import load_model; load_model({name!r})"])
        results[name] = {"whole": check(name, stream=False), "streamed": check(name, stream=True)}
    print(f"{'model':<14} {'run':<14} {'seconds':>8} {'ratio':>7} {'peak GiB':>9} {'held GiB':>9} {'bound GiB':>10}"
          "  verdict")
    for model, runs in results.items():
        base = runs.get("bare_forward", runs.get("whole"))
        for label, run in runs.items():
            memory = run.get("memory", {})
            seconds = run["forward_s"] if label == "bare_forward" else run["seconds"]
            ratio = seconds / (base["forward_s"] if "forward_s" in base else base["seconds"])
            verdict = "" if "passed" not in run else (f"{'PASSED' if run['passed'] else 'FAILED'}, "
                                                      f"{run['controls_broken']}/{run['controls']} controls broken")
            print(f"{model:<14} {label:<14} {seconds:>8.2f} {ratio:>7.1f} {gib(run['peak_rss_bytes']):>9} "
                  f"{gib(memory.get('held_bytes')):>9} {gib(memory.get('bound_bytes')):>10}  {verdict}")
        if "whole" in runs and "verdicts" in runs["whole"] and "verdicts" in runs["streamed"]:
            same = runs["whole"]["verdicts"] == runs["streamed"]["verdicts"]
            print(f"{'':<14} same verdicts streamed and whole: {same}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
