"""Several sessions' first page runs on a just-started server, at once: each comes through
ui.runtime.first_imports.library_imported (as app.py sends every page but Home), then builds or loads a model, the
way the Symmetry matrix, a sidebar's model load and Check do. Without the guard, 4 of 4 fresh processes running
these three threads failed with a half-imported transformers ("cannot import name 'AutoConfig'")."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SESSIONS = """
import json, sys, threading
assert "transformers" not in sys.modules and "torch" not in sys.modules
from ui.runtime.first_imports import library_imported

def matrix_row():
    from perm_core.models.random_models import build_random_model
    build_random_model("vit")

def sidebar_load():
    from perm_core.models.registry import load_model
    load_model("random:gpt2")

def check_load():
    from perm_core.models.registry import load_model
    load_model("digits-vit")

errors, start = [], threading.Barrier(3)
def session(work):
    start.wait()
    try:
        library_imported()
        work()
    except Exception as error:
        errors.append(f"{work.__name__}: {type(error).__name__}: {error}")

threads = [threading.Thread(target=session, args=(work,)) for work in (matrix_row, sidebar_load, check_load)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps(errors))
"""


def test_sessions_starting_at_once_each_get_a_whole_library():
    result = subprocess.run([sys.executable, "-c", SESSIONS], cwd=ROOT, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
