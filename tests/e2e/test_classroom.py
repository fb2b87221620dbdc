"""The classroom load test, small: 3 Chromium sessions open the same dinov2-s link at once (two sessions on
one model corrupted it before perm_core.stateless), then Explore (digits-vit, dinov2-s, minilm) for 20 s of key
changes, then Check and Rotation. No errors anywhere, every shared model's weights hash as before, and each session's
verdicts and numbers equal a run of the same settings alone on a fresh server. Timings are not asserted."""

import json
import os
import subprocess
import sys

from tests.e2e.conftest import ROOT


def test_three_students_at_once(tmp_path):
    out = tmp_path / "classroom.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "classroom.py"), "--sessions", "3", "--seconds",
                          "20", "--samples", "3", "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=600)
    assert out.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["errors"] == [], figures["errors"]
    assert figures["finished_sessions"] == 3
    done = {(row["model"], row["interaction"]) for row in figures["latency"]}
    for model in ("digits-vit", "dinov2-s", "minilm"):
        assert {(model, "open Explore"), (model, "key change"), (model, "run Check")} <= done
    assert {("digits-vit", "Rotation"), ("minilm", "Rotation")} <= done
    shared_link = next(row for row in figures["latency"] if row["interaction"] == "shared link")
    assert shared_link["model"] == "dinov2-s" and shared_link["n"] == 3  # three sessions on one model at once
    weights = figures["weights"]
    assert {"digits-vit/float32", "dinov2-s/float32", "minilm/float32"} <= set(weights)
    for label, hashes in weights.items():
        assert len(hashes["loaded"]) == 64 and hashes["loaded"] == hashes["at_exit"] == hashes["fresh_process"], label
    assert figures["weights_unchanged"]
    assert [v["model"] for v in figures["same_as_alone"]] == ["digits-vit", "dinov2-s", "minilm"]
    assert all(v["same"] for v in figures["same_as_alone"]), figures["same_as_alone"]
    assert figures["memory"]["server_peak_rss_bytes"] > figures["memory"]["loaded_float32_weights_bytes"] > 0
    assert figures["ok"] and run.returncode == 0, run.stdout[-3000:]
