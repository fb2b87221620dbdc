"""Take-home summaries as Markdown: of a Check run (the model, input and keys, the verdict, every check's and every
negative control's numbers) and of an Explore run (the model, input, keys and control, the verdict, the key
figures, the worst error of each kind of tensor), each with the command that reproduces it. Every number is the
report's or the result's own."""

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


def explore_summary(model: str, input_label: str, keys_text: str, result, verdict: str, proof_rows: list[dict],
                    command: str, routing=()) -> str:
    """result: a perm_core.explore.exploration.ExploreResult; verdict: the page's verdict line; proof_rows: the
    proof chart's rows (perm_core.explore.page_data: one per compared tensor, with its kind and errors); routing: a
    mixture of experts' RoutingView of each of its MoE blocks (perm_core.explore.routing), none for a dense model."""
    dtype = str(result.dtype).split(".")[-1]
    control = result.control
    lines = [f"# Explore: {model} ({dtype})", "", f"- **Input:** {input_label}", f"- **Keys:** {keys_text}",
             f"- **Negative control:** {control.description if control else 'none (the keys applied correctly)'}",
             f"- **Verdict:** {verdict}", "", "## Key figures", "", "| what | value |", "|---|---|"]
    if not result.scramble.is_identity:
        lines.append(f"| scrambled differs from the original by (relative; {result.moved_what}) | {result.moved:.2g} |")
    lines += [f"| un-scrambled differs from the original by (worst relative error) | {result.worst_rel:.1e} |",
              f"| worst absolute error | {result.worst_abs:.1e} |",
              f"| tolerance ({dtype}) | {result.tolerance:.0e} |",
              f"| tensors compared | {len(result.errors)} |"]
    kinds: dict[str, list[dict]] = {}
    for row in proof_rows:
        kinds.setdefault(row["kind"], []).append(row)
    lines += ["", "## Worst error of each kind of tensor", "", "| tensors | how many | max rel error | max abs error |",
              "|---|---|---|---|"]
    lines += [f"| {kind} | {len(rows)} | {max(r['rel'] for r in rows):.1e} | {max(r['abs'] for r in rows):.1e} |"
              for kind, rows in kinds.items()]
    if routing:
        lines += ["", "## Experts chosen (each mixture-of-experts block)", "",
                  "| block | tokens whose scrambled choice is the original's moved by the keys | tokens that chose the "
                  "original's experts after un-scrambling | un-scrambled routing weights, largest difference |",
                  "|---|---|---|---|"]
        lines += [f"| {v.layer} | {v.as_expected} of {v.n_tokens} | {v.came_back} of {v.n_tokens} | "
                  f"{v.weights_error:.1e} |" for v in routing]
    lines += ["", "## Reproduce", "", "The same model, input and keys from a terminal (the full check: each symmetry "
              "on its own and all together, and the negative controls):", "", "```bash", command, "```", ""]
    return "\n".join(lines)
