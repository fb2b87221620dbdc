"""Every process-wide setting is read once, in one of two places (perm_core.limits for the library's,
ui.runtime.settings for the app's), and a bad value fails only where it is read, naming its variable."""

import re
from pathlib import Path

import pytest

from perm_core import limits
from ui.runtime import settings

ROOT = Path(__file__).resolve().parents[2]
READERS = {"perm_core/limits.py": limits, "ui/runtime/settings.py": settings}


def test_defaults_parse_to_the_documented_values():
    library, app = limits.Limits(), settings.RuntimeSettings()
    assert library.params_cache_bytes == 640 * 2**20 and library.keep_freed_memory is True
    assert app.run_budget_bytes == 384 * 2**20
    assert (app.explorations_cache_bytes, app.results_cache_bytes, app.pages_cache_bytes) == (
        192 * 2**20, 192 * 2**20, 128 * 2**20)
    assert (app.page_runs, app.concurrent_runs) == (2, 2)
    assert app.memory_audit_file is None and app.weights_hash_file is None


@pytest.mark.parametrize("module", READERS.values(), ids=READERS.keys())
def test_each_docstring_table_lists_its_own_variables_with_their_defaults(module):
    rows = re.findall(r"^\| (TSE_[A-Z_]+) +\| (\S+) +\|", module.__doc__, flags=re.MULTILINE)
    assert rows == [(variable, default or "unset") for variable, default in module.DEFAULTS.items()]


def test_the_two_modules_read_different_variables():
    assert set(limits.DEFAULTS).isdisjoint(settings.DEFAULTS)
    assert set(limits.DEFAULTS) == {"TSE_PARAMS_CACHE_MB", "TSE_KEEP_FREED_MEMORY"}


def test_values_from_the_environment_and_a_bad_one_fails_only_where_it_is_read():
    environ = {"TSE_PAGES_CACHE_MB": "0.5", "TSE_PAGE_RUNS": "0", "TSE_RESULTS_CACHE_MB": "not-a-number",
               "TSE_RUN_BUDGET_MB": "-3", "TSE_MEMORY_AUDIT_FILE": "/tmp/m.json", "TSE_KEEP_FREED_MEMORY": "0",
               "TSE_PARAMS_CACHE_MB": "inf"}
    app = settings.RuntimeSettings.from_environment(environ)
    assert app.pages_cache_bytes == 2**19 and app.page_runs == 1  # at least one run at a time
    assert app.memory_audit_file == Path("/tmp/m.json")
    assert app.explorations_cache_bytes == 192 * 2**20  # the others are unaffected
    assert app.values["TSE_RESULTS_CACHE_MB"] == "not-a-number"  # kept as written
    with pytest.raises(ValueError, match="TSE_RESULTS_CACHE_MB='not-a-number' is not a number"):
        app.results_cache_bytes  # noqa: B018
    with pytest.raises(ValueError, match="TSE_RUN_BUDGET_MB='-3' must be a finite number >= 0"):
        app.run_budget_bytes  # noqa: B018
    library = limits.Limits.from_environment(environ)
    assert not library.keep_freed_memory and set(library.values) == set(limits.DEFAULTS)
    with pytest.raises(ValueError, match="TSE_PARAMS_CACHE_MB='inf' must be a finite number >= 0"):
        library.params_cache_bytes  # noqa: B018


@pytest.mark.parametrize(("module", "mine"), [(limits, limits.Limits({**limits.DEFAULTS, "TSE_PARAMS_CACHE_MB": "5"})),
                                              (settings, settings.RuntimeSettings({**settings.DEFAULTS,
                                                                                    "TSE_PAGE_RUNS": "5"}))],
                         ids=READERS.keys())
def test_use_replaces_the_process_settings_and_gives_the_old_ones_back(module, mine):
    previous = module.use(mine)
    try:
        assert module.current() is mine and module.current().values == mine.values
    finally:
        assert module.use(previous) is mine
    assert module.current() is previous


def test_no_other_module_reads_a_tse_variable_from_the_environment():
    readers = []
    for path in [*ROOT.joinpath("perm_core").rglob("*.py"), *ROOT.joinpath("ui").rglob("*.py"),
                 *ROOT.joinpath("pages").rglob("*.py"), ROOT / "app.py"]:
        text = path.read_text()
        if re.search(r"(os\.environ|getenv)[^\n]*TSE_", text):
            readers.append(str(path.relative_to(ROOT)))
    assert readers == []  # from_environment reads its class's DEFAULTS, naming no variable

    def named(folder: str) -> set[str]:
        return {variable for path in ROOT.joinpath(folder).rglob("*.py")
                for variable in re.findall(r"\bTSE_[A-Z_]+\b", path.read_text())}

    assert named("perm_core") == set(limits.DEFAULTS)  # the library names none of the app's settings
    assert named("ui") <= set(limits.DEFAULTS) | set(settings.DEFAULTS)
