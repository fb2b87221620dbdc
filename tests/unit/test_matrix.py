"""The symmetry matrix: one cell per family x symmetry, each from a measured float64 check."""

from __future__ import annotations

import dataclasses

import pytest

from perm_core.__main__ import main
from perm_core.engine.spec import Rule
from perm_core.engine.symmetries import SYMMETRIES
from perm_core.families import llama as llama_family
from perm_core.verify import matrix
from tests.unit.json_schema import validated


def run_cli(capsys, *argv) -> tuple[int, str]:
    code = main(["matrix", *argv])
    return code, capsys.readouterr().out


def test_matrix_json_shape_and_cells(capsys):
    code, out = run_cli(capsys, "--family", "gpt2", "--family", "gemma3", "--json")
    document = validated("matrix", out)
    assert code == 0 and document["passed"] is True
    assert document["symmetries"] == list(SYMMETRIES) and document["dtype"] == "float64"
    rows = {row["family"]: row for row in document["families"]}
    assert set(rows) == {"gpt2", "gemma3"}
    for row in rows.values():
        assert set(row["cells"]) == set(SYMMETRIES)
        for symmetry, cell in row["cells"].items():
            if symmetry in ("experts", "router_shift"):  # dense: nothing to reorder or translate, said so
                assert cell["status"] == matrix.NOT_APPLICABLE and "no mixture-of-experts" in cell["reason"]
                assert cell["controls"] == 0 and cell["max_rel_error"] == 0
                continue
            assert cell["status"] in (matrix.HOLDS, matrix.RESTRICTED), (row["family"], symmetry)
            assert 0 < cell["max_rel_error"] <= 1e-9
            assert cell["controls"] >= 1 and cell["controls_broken"] == cell["controls"]
    assert {s for s, c in rows["gpt2"]["cells"].items() if c["status"] == matrix.RESTRICTED} == set()
    gemma = rows["gemma3"]["cells"]
    assert {s for s, c in gemma.items() if c["status"] == matrix.RESTRICTED} == {"head_channels", "rotation"}
    assert "Q/K norm" in gemma["rotation"]["reason"] and "RoPE" in gemma["head_channels"]["reason"]


def test_every_registered_family_has_a_random_model_for_the_matrix():
    from perm_core.models.random_models import random_config

    for family in matrix.families():
        assert random_config(family) is not None


def test_a_spec_bug_shows_as_a_failed_cell_and_exit_one(capsys, monkeypatch):
    def forgets_mlp_down(g):
        return tuple(Rule(r.pattern, (None,) * len(r.axes), r.tag) if r.tag == "mlp.out" else r
                     for r in llama_family.rules(g))

    monkeypatch.setattr(llama_family, "FAMILY", dataclasses.replace(llama_family.FAMILY, rules=forgets_mlp_down))
    code, out = run_cli(capsys, "--family", "llama")
    assert code == 1
    assert "FAILED" in out.splitlines()[1]
    row = matrix.family_row("llama")
    assert row.cells["mlp"].status == matrix.FAILED and row.cells["channels"].status == matrix.FAILED
    assert row.cells["heads"].status == matrix.HOLDS and not row.passed


def test_unknown_family_is_a_usage_error(capsys):
    assert main(["matrix", "--family", "nope"]) == 2
    assert "supported" in capsys.readouterr().err


@pytest.mark.parametrize("bad_key", ["-1", "abc"])
def test_bad_key_is_a_usage_error(capsys, bad_key):
    assert main(["matrix", "--key", bad_key, "--family", "gpt2"]) == 2


def test_a_row_is_the_same_bits_whatever_the_process_thread_count():
    import torch

    saved = torch.get_num_threads()
    try:
        rows = []
        for count in (2, 1):  # two threads split gpt2's float64 reductions differently: 2.35e-15 vs 2.23e-15
            torch.set_num_threads(count)
            rows.append(matrix.family_row("gpt2"))
    finally:
        torch.set_num_threads(saved)
    errors = [[row.cells[s].max_rel_error for s in SYMMETRIES if s not in ("experts", "router_shift")]
              for row in rows]  # the mixtures of experts' own: n/a
    assert errors[0] == errors[1] and all(0 < e < 1e-12 for e in errors[0])
