"""What perm_core.run.numerics says about the stock code is true: which families downcast a float64 model.

transformers' eager attention of ViT and Llama computes the softmax in float32 (and Llama's RMSNorm
normalizes in float32), so a float64 model is off by ~1e-7 from full precision; BERT's and GPT-2's
eager attention compute in the model's dtype, so the replacement changes nothing for them; a float32
model computes exactly what it did before in every family.
"""

import copy

import pytest
import torch
import transformers as hf

from perm_core.models.random_models import DEFAULT_CLASSES, random_config, random_inputs, randomize_
from perm_core.run.numerics import use_exact_numerics

pytestmark = pytest.mark.usefixtures("one_thread")


def stock_and_exact(family: str, dtype: torch.dtype):
    config = random_config(family)
    torch.manual_seed(0)
    stock = randomize_(getattr(hf, DEFAULT_CLASSES[family])(config).to(dtype), 0).eval()
    stock.set_attn_implementation("eager")
    exact = copy.deepcopy(stock)
    use_exact_numerics(exact)
    return stock, exact


def logits_gap(family: str, dtype: torch.dtype) -> float:
    stock, exact = stock_and_exact(family, dtype)
    inputs = random_inputs(family, stock, 0)
    inputs = {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}
    with torch.no_grad():
        a, b = stock(**inputs).logits, exact(**inputs).logits
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("family", ["vit", "llama"])
def test_stock_vit_and_llama_downcast_a_float64_model(family):
    assert 1e-10 < logits_gap(family, torch.float64) < 1e-5  # float32 round-off, not float64's ~1e-16


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_stock_bert_and_gpt2_compute_in_the_models_dtype(family):
    assert logits_gap(family, torch.float64) == 0.0
    stock, _ = stock_and_exact(family, torch.float64)
    assert not getattr(stock.config, "reorder_and_upcast_attn", False)  # GPT-2's float32 path is off


@pytest.mark.parametrize("family", ["vit", "bert", "gpt2", "llama"])
def test_float32_models_compute_what_they_did_before(family):
    assert logits_gap(family, torch.float32) == 0.0
