"""Symmetry matrix: which symmetries each supported architecture has, measured on a random model of each."""

from ui.view import through_app

through_app()  # before the page's own imports: a run without app.py goes again through it

import streamlit as st

from perm_core.engine.symmetries import SYMMETRIES
from perm_core.verify.matrix import FAILED, NOT_APPLICABLE, NOT_HOLDING, RESTRICTED, families, family_row
from ui.long_run import long_run
from ui.matrix_table import COLOURS, LABELS, LEGEND, matrix_html
from ui.sidebar import SYMMETRY_LABELS, ensure_view
from ui.state import publish


def main() -> None:
    """The page's data lives in this frame: nothing of a run outlives it in the page's globals."""
    ensure_view("none")
    st.title("Symmetry matrix: which architecture has which symmetry")
    st.markdown("Not every symmetry exists in every architecture: RoPE pins query/key channels to their rotary "
                "planes, a per-channel Q/K norm gain pins them to their axes, a relative position bias reads the "
                "order of the tokens. Each row below is **measured**: a random model of the family (weights far "
                "from initialization) is checked in float64, forward and backward, every symmetry with key 12345 "
                "and its negative controls. `python -m perm_core matrix --json` prints the same matrix. Click a "
                "cell to open Explore on that model with only that symmetry switched on.")

    @st.cache_resource(show_spinner=False, max_entries=64)
    def measured_row(family: str):
        """One family's row, measured once per server process (random models are deterministic)."""
        return family_row(family)

    names = families()
    rows = []
    with long_run("matrix", tuple(names), "the symmetry matrix") as progress:
        for i, family in enumerate(names):
            progress(i / len(names), f"checking random:{family} ({i + 1} of {len(names)})")
            rows.append(measured_row(family))

    st.html(matrix_html(rows, SYMMETRY_LABELS))
    st.html("<p>" + " &nbsp; ".join(f'<span style="background:{COLOURS[s]};padding:0 0.4rem">{LABELS[s]}</span> '
                                     f"{LEGEND[s]}" for s in LEGEND) + "</p>")
    failed = [f"{r.family} / {s}" for r in rows for s in SYMMETRIES if r.cells[s].status == FAILED]
    if failed:
        st.error(f"{len(failed)} cell(s) FAILED their check: {', '.join(failed)}. Run `python -m perm_core check "
                 "random:FAMILY` for the report.")
    else:
        statuses = [r.cells[s].status for r in rows for s in SYMMETRIES]
        n_missing, n_na = statuses.count(NOT_HOLDING), statuses.count(NOT_APPLICABLE)
        n_exact = len(statuses) - n_missing - n_na
        st.success(f"{len(rows)} families x {len(SYMMETRIES)} symmetries: {n_exact} "
                   f"{'holds' if n_exact == 1 else 'hold'} exactly (in full or in a restricted form), {n_missing} "
                   f"{'does' if n_missing == 1 else 'do'} not hold and each break was measured, {n_na} "
                   f"{'has' if n_na == 1 else 'have'} nothing to act on; every negative control broke.")

    st.subheader("Why a symmetry is restricted or missing")
    reasons = [f"- **{r.family} / {SYMMETRY_LABELS[s]}** ({LABELS[r.cells[s].status]}, "
               f"{'measured break' if r.cells[s].status == NOT_HOLDING else 'worst error'} "
               f"{r.cells[s].max_rel_error:.1e}): {r.cells[s].reason}"
               for r in rows for s in SYMMETRIES if r.cells[s].status in (RESTRICTED, NOT_HOLDING)]
    st.markdown("\n".join(reasons) if reasons else "Every family has every symmetry in full.")
    publish()


main()
