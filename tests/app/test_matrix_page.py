"""AppTest: the Symmetry matrix page shows every registered family, measured, with links to Explore."""

import re
from urllib.parse import parse_qs, urlparse

from streamlit.testing.v1 import AppTest

from perm_core.engine.symmetries import SYMMETRIES
from perm_core.verify import matrix
from tests.app.conftest import APP


def matrix_page() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    at.switch_page("pages/matrix.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def table_html(at: AppTest) -> str:
    return next(h.proto.body for h in at.get("html") if "symmetry-matrix" in h.proto.body)


def test_every_family_is_a_row_and_every_cell_links_to_explore_with_only_its_symmetry():
    at = matrix_page()
    assert at.title[0].value.startswith("Symmetry matrix")
    body = table_html(at)
    names = re.findall(r'<tr><th><span class="class-name">(.+?)</span><br>', body)
    rows = [name.replace("<wbr>", "") for name in names]
    assert rows == matrix.families()
    links = re.findall(r'href="([^"]+)"', body)
    assert len(links) == len(rows) * len(SYMMETRIES)
    first = parse_qs(urlparse(links[0].replace("&amp;", "&")).query)
    assert urlparse(links[0]).path == "explore" and first["model"] == [f"random:{rows[0]}"]
    assert [s for s in SYMMETRIES if first[f"on_{s}"] == ["1"]] == [SYMMETRIES[0]]
    # the cell's own dtype and key: Explore then measures what the cell measured (float64, not the sidebar's float32)
    assert first["dtype"] == ["float64"] and first[f"k_{SYMMETRIES[0]}"] == [str(matrix.MATRIX_KEY)]


def test_the_numbers_and_the_summary_come_from_the_measured_rows():
    at = matrix_page()
    body = table_html(at)
    gpt2 = matrix.family_row("gpt2")
    row_html = body[body.index('<th><span class="class-name">gpt2</span><br>'):].split("</tr>")[0]
    shown = re.findall(r"<code>([^<]+)</code>", row_html)
    assert shown == [f"{gpt2.cells[s].max_rel_error:.1e}" if gpt2.cells[s].status != matrix.NOT_APPLICABLE else "—"
                     for s in SYMMETRIES]
    assert "—" in shown and len(shown) == len(SYMMETRIES)  # experts and router_shift: nothing to act on in gpt2
    summary = at.success[0].value
    n_rows = len(matrix.families())
    assert summary.startswith(f"{n_rows} families x {len(SYMMETRIES)} symmetries")
    assert "restricted" in "\n".join(m.value for m in at.markdown)  # llama's RoPE reasons are listed
    # the sidebar acts on nothing here and says so
    assert not at.sidebar.selectbox
