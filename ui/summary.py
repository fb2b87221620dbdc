"""A take-home summary of a Check run as Markdown: the model, input and keys, the verdict, every check's and every
negative control's numbers, and the command that reproduces the report. Every number is the report's own."""

from __future__ import annotations


def check_summary(report, verdict: str, input_label: str, keys_text: str, command: str) -> str:
    """report: a perm_core.verify Report; verdict: the page's verdict line (PASSED/FAILED and its summary)."""
    lines = [f"# Check: {report.model} ({report.family}, {report.dtype})", "",
             f"- **Input:** {input_label}", f"- **Keys:** {keys_text}", f"- **Verdict:** {verdict}"]
    if report.oracle is not None:
        o = report.oracle
        lines.append(f"- **Oracle:** the original run's {o.output} against transformers' own forward: "
                     f"{o.max_rel_error:.1e} relative (tolerance {o.tolerance:.0e}), "
                     + ("agrees" if o.passed else "DISAGREES"))
    lines += ["", "## Checks", "", "| symmetry | direction | max rel error | tolerance | result |",
              "|---|---|---|---|---|"]
    lines += [f"| {c.symmetry} | {c.direction} | {c.max_rel_error:.1e} | {c.tolerance:.0e} | "
              f"{'pass' if c.passed else 'FAIL'} |" for c in report.checks]
    if report.controls:
        lines += ["", "## Negative controls (each must break)", "", "| control | max rel error | result |",
                  "|---|---|---|"]
        lines += [f"| {c.symmetry}: {c.description} | {c.max_rel_error:.1e} | "
                  + ("broken, as it must" if c.broken else "cannot bite here" if not c.informative else "NOT BROKEN")
                  + " |" for c in report.controls]
    lines += ["", "## Reproduce", "", "```bash", command, "```", ""]
    return "\n".join(lines)
