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


def test_every_branch_of_the_summary_says_what_its_report_says():
    """Each row's tolerance is its check's own; the oracle line follows the oracle's verdict; each control's word
    follows its result (broken, not informative here, not broken): a report with one of each, made from a real one."""
    from dataclasses import replace

    loaded = load_model("digits-vit", dtype=torch.float64)
    report = check(loaded.model, default_inputs(loaded), ["channels"], {"channels": 42}, model_name="digits-vit",
                   backward=False)
    assert len(report.controls) >= 2 and report.oracle.passed
    checks = [replace(report.checks[0], tolerance=3e-7)]
    controls = [report.controls[0], replace(report.controls[1], broken=False, informative=False),
                replace(report.controls[0], broken=False)]
    failing_oracle = replace(report.oracle, max_rel_error=report.oracle.tolerance * 10)
    text = check_summary(replace(report, checks=checks, controls=controls, oracle=failing_oracle), "FAILED",
                         "test digit #0", "channels 42", "python -m perm_core check digits-vit")
    assert re.search(r"^\| channels \| forward \| [\d.e+-]+ \| 3e-07 \| pass \|$", text, re.M)
    assert f"{failing_oracle.max_rel_error:.1e} relative (tolerance {failing_oracle.tolerance:.0e}), DISAGREES" in text
    words = re.findall(r"^\| \w+: .+ \| [\d.e+-]+ \| (.+) \|$", text, re.M)
    assert words == ["broken, as it must", "cannot bite here", "NOT BROKEN"]
    agreeing = check_summary(report, "PASSED", "test digit #0", "channels 42", "python -m perm_core check digits-vit")
    assert "), agrees" in agreeing and "DISAGREES" not in agreeing
