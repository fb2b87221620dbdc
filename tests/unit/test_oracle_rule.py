"""verify.oracle.judged, the one oracle rule of the whole-model and the streamed check, at its edges: an output the
stock forward lacks or shapes differently, a non-finite one, and round-off asked for only when the error needs it."""

from __future__ import annotations

import math

import torch

from perm_core.verify.oracle import judged
from perm_core.verify.tolerances import TOLERANCE

F64 = torch.float64


def outputs(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {"logits": torch.randn(1, 5, 11, generator=generator, dtype=F64),
            "last_hidden": torch.randn(1, 5, 8, generator=generator, dtype=F64)}


def never_rerun(dtype, name):
    raise AssertionError(f"no round-off needed here, but {name} was rerun in {dtype}")


def test_equal_outputs_pass_without_a_rerun():
    traced = outputs()
    result = judged({n: t.clone() for n, t in traced.items()}, traced, F64, "sdpa", never_rerun)
    assert result.passed and result.max_rel_error == 0.0 and result.tolerance == TOLERANCE[F64]


def test_an_output_the_stock_forward_lacks_fails_by_name():
    traced = outputs()
    stock = {"logits": traced["logits"].clone()}  # no last hidden state
    result = judged(stock, traced, F64, "sdpa", never_rerun)
    assert not result.passed and result.max_rel_error == math.inf and result.output == "last_hidden"
    stock["last_hidden"] = None  # a field the stock output holds as None
    result = judged(stock, traced, F64, "sdpa", never_rerun)
    assert not result.passed and result.output == "last_hidden"


def test_an_output_of_another_shape_fails_by_name():
    traced = outputs()
    stock = {"logits": traced["logits"].clone(), "last_hidden": traced["last_hidden"][:, :4].clone()}
    result = judged(stock, traced, F64, "sdpa", never_rerun)
    assert not result.passed and result.max_rel_error == math.inf and result.output == "last_hidden"


def test_a_non_finite_output_fails_and_is_named_among_finite_ones():
    traced = outputs()
    stock = {n: t.clone() for n, t in traced.items()}
    stock["logits"] = stock["logits"] * (1 + 1e-12)  # a finite error first, within tolerance
    for bad in (math.nan, math.inf):
        broken = dict(traced, last_hidden=traced["last_hidden"].clone())
        broken["last_hidden"][0, 2, 3] = bad
        result = judged(stock, broken, F64, "sdpa", never_rerun)
        assert not result.passed and not math.isfinite(result.max_rel_error) and result.output == "last_hidden"


def test_an_error_over_the_base_tolerance_is_allowed_only_its_measured_round_off():
    traced = outputs()
    stock = {n: t.clone() for n, t in traced.items()}
    stock["logits"] = stock["logits"] + 1e-7 * stock["logits"].abs().max()  # over float64's 1e-9
    asked = []

    def rerun(dtype, name):
        asked.append((dtype, name))
        return traced[name].to(torch.float32).to(F64) + 1e-6 * traced[name].abs().max()

    allowed = judged(stock, traced, F64, "sdpa", rerun)
    assert asked == [(torch.float32, "logits")] and allowed.output == "logits"
    assert allowed.passed and TOLERANCE[F64] < allowed.tolerance <= 1e-3

    def exact_rerun(dtype, name):  # no round-off measured: the base tolerance stays, and the error fails
        return traced[name].clone()

    assert not judged(stock, traced, F64, "sdpa", exact_rerun).passed
