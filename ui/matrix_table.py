"""The symmetry matrix as an HTML table: one coloured cell per family x symmetry, each a link to Explore."""

from __future__ import annotations

import html
import re
from urllib.parse import urlencode

from perm_core.engine.symmetries import SYMMETRIES
from perm_core.verify.matrix import (
    FAILED,
    HOLDS,
    MATRIX_DTYPE,
    MATRIX_KEY,
    NOT_APPLICABLE,
    NOT_HOLDING,
    RESTRICTED,
    Row,
)

# The app's one colour convention: green = exact, amber = exact in a restricted form, grey = the architecture
# does not have it (measured), red = something is wrong.
COLOURS = {HOLDS: "#d8f0dc", RESTRICTED: "#fcefc7", NOT_HOLDING: "#e4e4e7", NOT_APPLICABLE: "#ffffff",
           FAILED: "#f8d0d0"}
LABELS = {HOLDS: "holds", RESTRICTED: "restricted", NOT_HOLDING: "does not hold", NOT_APPLICABLE: "n/a",
          FAILED: "FAILED"}
LEGEND = {HOLDS: "exact: worst float64 relative error of the check, forward and backward (Explore, which a cell "
                 "opens, runs the forward pass only: its number can be smaller)",
          RESTRICTED: "exact in a restricted form (hover, or see the reasons below)",
          NOT_HOLDING: "the architecture does not have it: the number is the measured break of its standard element",
          NOT_APPLICABLE: "nothing in the architecture for it to act on (experts on a dense model)",
          FAILED: "the check failed: a bug"}


def explore_link(row: Row, symmetry: str) -> str:
    """Explore with this family's random model, only this symmetry switched on, in the cell's dtype (float64) and
    with the cell's key (its URL state): the cell's number and Explore's are then measured alike."""
    params = {"model": row.model, "dtype": MATRIX_DTYPE, f"k_{symmetry}": str(MATRIX_KEY),
              **{f"on_{name}": "1" if name == symmetry else "0" for name in SYMMETRIES}}
    return f"explore?{urlencode(params)}"


def class_name_html(name: str) -> str:
    """A class name that may break only between its words: ViT<wbr>For<wbr>Image<wbr>Classification, never
    "ViTForImageC / lassification" (the cell is narrow at 1024 px; the table's cells otherwise break anywhere)."""
    words = re.split(r"(?<=[A-Za-z0-9])(?=[A-Z][a-z]{2})", name)  # before each capitalized word: For, Image, Model
    return '<span class="class-name">' + "<wbr>".join(html.escape(word) for word in words) + "</span>"


def family_html(name: str) -> str:
    """A family name that may break only after an underscore: qwen2_<wbr>moe, never "qwen2_m / oe"."""
    words = re.split(r"(?<=_)", name)
    return '<span class="class-name">' + "<wbr>".join(html.escape(word) for word in words) + "</span>"


def cell_number(cell) -> str:
    """The cell's measured error; none where the architecture has nothing for the symmetry to act on (nothing ran)."""
    return "—" if cell.status == NOT_APPLICABLE else f"{cell.max_rel_error:.1e}"


def matrix_html(rows: list[Row], labels: dict[str, str]) -> str:
    head = "".join(f"<th>{html.escape(labels[s])}</th>" for s in SYMMETRIES)
    body = []
    for row in rows:
        cells = []
        for symmetry in SYMMETRIES:
            cell = row.cells[symmetry]
            tip = html.escape(cell.reason or LEGEND[cell.status], quote=True)
            cells.append(
                f'<td style="background:{COLOURS[cell.status]}" title="{tip}">'
                f'<a href="{html.escape(explore_link(row, symmetry), quote=True)}" target="_self">'
                f"{LABELS[cell.status]}<br><code>{cell_number(cell)}</code></a></td>")
        body.append(f"<tr><th>{family_html(row.family)}<br><small>{class_name_html(row.model_class)}</small></th>"
                    f"{''.join(cells)}</tr>")
    return ('<table class="symmetry-matrix"><thead><tr><th>family</th>' + head + "</tr></thead><tbody>"
            + "".join(body) + "</tbody></table>")
