"""The Check page's take-home summary: every number in it is the report's own, and the command reproduces it."""

import re

import torch

from perm_core.models.defaults import default_inputs
from perm_core.models.registry import load_model
from perm_core.verify.check import check
from ui.summary import check_summary


def test_the_summary_carries_the_reports_numbers_and_its_command():
    loaded = load_model("digits-vit", dtype=torch.float64)
    report = check(loaded.model, default_inputs(loaded), ["tokens", "channels"], {"tokens": 7, "channels": 42},
                   model_name="digits-vit", backward=False)
    command = "python -m perm_core check digits-vit --dtype float64 --keys tokens=7,channels=42"
    text = check_summary(report, "PASSED — it holds", "test digit #0", "tokens 7, channels 42", command)
    assert text.startswith("# Check: digits-vit (vit, float64)") and "**Keys:** tokens 7, channels 42" in text
    rows = re.findall(r"^\| (\w+) \| (forward|backward) \| ([\d.e+-]+) \| ([\d.e+-]+) \| (pass|FAIL) \|$", text, re.M)
    assert [(s, d, float(e)) for s, d, e, _, _ in rows] == [
        (c.symmetry, c.direction, float(f"{c.max_rel_error:.1e}")) for c in report.checks]
    controls = re.findall(r"^\| \w+: .+ \| ([\d.e+-]+) \| broken, as it must \|$", text, re.M)
    assert len(controls) == len(report.controls) and [float(v) for v in controls] == [
        float(f"{c.max_rel_error:.1e}") for c in report.controls]
    assert f"```bash\n{command}\n```" in text
