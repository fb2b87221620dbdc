"""Every process-wide setting is read once, in one place (perm_core.limits), and a bad value fails only where it is
read, naming its variable."""

import re
from pathlib import Path

import pytest

from perm_core import limits

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_parse_to_the_documented_values():
    settings = limits.Limits()
    assert settings.params_cache_bytes == 640 * 2**20 and settings.run_budget_bytes == 384 * 2**20
    assert (settings.explorations_cache_bytes, settings.results_cache_bytes, settings.pages_cache_bytes) == (
        192 * 2**20, 192 * 2**20, 128 * 2**20)
    assert (settings.page_runs, settings.concurrent_runs, settings.keep_freed_memory) == (2, 2, True)
    assert settings.memory_audit_file is None and settings.weights_hash_file is None
    for variable, default in limits.DEFAULTS.items():  # the table in the docstring lists every one, with its default
        assert re.search(rf"\| {variable} +\| {default or 'unset'} +\|", limits.__doc__), variable


def test_values_from_the_environment_and_a_bad_one_fails_only_where_it_is_read():
    settings = limits.Limits.from_environment({"TSE_PAGES_CACHE_MB": "0.5", "TSE_PAGE_RUNS": "0",
                                               "TSE_RESULTS_CACHE_MB": "not-a-number",
                                               "TSE_RUN_BUDGET_MB": "-3", "TSE_MEMORY_AUDIT_FILE": "/tmp/m.json",
                                               "TSE_KEEP_FREED_MEMORY": "0"})
    assert settings.pages_cache_bytes == 2**19 and settings.page_runs == 1  # at least one run at a time
    assert settings.memory_audit_file == Path("/tmp/m.json") and not settings.keep_freed_memory
    assert settings.explorations_cache_bytes == 192 * 2**20  # the others are unaffected
    with pytest.raises(ValueError, match="TSE_RESULTS_CACHE_MB='not-a-number' is not a number"):
        settings.results_cache_bytes  # noqa: B018
    with pytest.raises(ValueError, match="TSE_RUN_BUDGET_MB='-3' must be a finite number >= 0"):
        settings.run_budget_bytes  # noqa: B018


def test_use_replaces_the_process_settings_and_gives_the_old_ones_back():
    mine = limits.Limits({**limits.DEFAULTS, "TSE_PAGE_RUNS": "5"})
    previous = limits.use(mine)
    try:
        assert limits.current() is mine and limits.current().page_runs == 5
    finally:
        assert limits.use(previous) is mine
    assert limits.current() is previous


def test_no_other_module_reads_a_tse_variable_from_the_environment():
    readers = []
    for path in [*ROOT.joinpath("perm_core").rglob("*.py"), *ROOT.joinpath("ui").rglob("*.py"),
                 *ROOT.joinpath("pages").rglob("*.py"), ROOT / "app.py"]:
        text = path.read_text()
        if re.search(r"(os\.environ|getenv)[^\n]*TSE_", text) and path.name != "limits.py":
            readers.append(str(path.relative_to(ROOT)))
    assert readers == []
    named = set()
    for path in [*ROOT.joinpath("perm_core").rglob("*.py"), *ROOT.joinpath("ui").rglob("*.py")]:
        named |= set(re.findall(r"\bTSE_[A-Z_]+\b", path.read_text()))
    assert named <= set(limits.DEFAULTS), named - set(limits.DEFAULTS)
