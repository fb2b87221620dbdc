"""Home, the first page a just-started server shows, imports neither torch nor transformers (nor the library): its
first run does not wait for them. ui.view keeps the sidebar's state without them."""

import json
import subprocess
import sys
from pathlib import Path

from perm_core.engine.symmetries import SYMMETRIES
from ui.state import DEFAULT_KEYS
from ui.view import KEPT_KEYS

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "perm_core.models.registry")
FIRST_RUN = """
import json, sys
from streamlit.testing.v1 import AppTest
at = AppTest.from_file("app.py", default_timeout=300)
at.query_params["model"] = "digits-vit"
at.run()
if {page!r}:
    at.switch_page({page!r}).run()
assert not at.exception, [e.value for e in at.exception]
print(json.dumps({{"title": at.title[0].value, "heavy": [m for m in {heavy!r} if m in sys.modules]}}))
"""


def first_run(page: str = "") -> dict:
    """A fresh process's first run of the app (Home, then `page` if given): its title and the heavy modules it
    imported."""
    done = subprocess.run([sys.executable, "-c", FIRST_RUN.format(page=page, heavy=HEAVY)], cwd=ROOT, text=True,
                          capture_output=True, timeout=600, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_home_imports_neither_torch_nor_transformers():
    shown = first_run()
    assert shown == {"title": "Transformer Symmetry Explorer", "heavy": []}


def test_control_explore_does_import_them():
    """The check above can fail: the same process opening Explore imports torch and the library."""
    shown = first_run("pages/explore.py")
    assert shown["title"].startswith("Explore") and {"torch", "perm_core.models.registry"} <= set(shown["heavy"])


def test_the_kept_sidebar_keys_name_every_symmetry():
    assert list(DEFAULT_KEYS) == list(SYMMETRIES)
    assert {f"k_{name}" for name in SYMMETRIES} | {f"on_{name}" for name in SYMMETRIES} <= set(KEPT_KEYS)
