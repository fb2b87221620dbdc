"""An outside oracle: the checkpoint `scramble` writes, reloaded by plain transformers (no perm_core code
on the reading side), computes the same logits as the original, for every family, rotations included.

Both sides run stock transformers with SDPA attention in float64. Stock RMSNorm (Llama, Gemma 3, Mistral, Qwen2,
Qwen3, Phi-3, q_norm/k_norm included) normalizes in float32 even for a float64 model, so permuting the channels it
sums over moves its result by float32 round-off: those families are compared at 1e-5, the others at float64
round-off. A negative control (one scrambled norm gain put back in its original order) must break far above either.
"""

from __future__ import annotations

import pytest
import torch
import transformers as hf

from perm_core.models.random_models import build_random_model, random_inputs
from tests.unit.scrambled_checkpoints import save_and_scramble

pytestmark = pytest.mark.usefixtures("one_thread")

# family -> (class, its first layer's norm gain: the negative control puts it back in the original order)
CLASSES = {
    "vit": ("ViTForImageClassification", "vit.layers.0.layernorm_before.weight"),
    "bert": ("BertForMaskedLM", "bert.encoder.layer.0.output.LayerNorm.weight"),
    "gpt2": ("GPT2LMHeadModel", "transformer.h.0.ln_1.weight"),
    "llama": ("LlamaForCausalLM", "model.layers.0.input_layernorm.weight"),
    "dinov2": ("Dinov2ForImageClassification", "dinov2.encoder.layer.0.norm1.weight"),
    "gemma3": ("Gemma3ForCausalLM", "model.layers.0.input_layernorm.weight"),
    "mistral": ("MistralForCausalLM", "model.layers.0.input_layernorm.weight"),
    "qwen2": ("Qwen2ForCausalLM", "model.layers.0.input_layernorm.weight"),
    "qwen3": ("Qwen3ForCausalLM", "model.layers.0.input_layernorm.weight"),
    "distilbert": ("DistilBertForMaskedLM", "distilbert.transformer.layer.0.sa_layer_norm.weight"),
    "roberta": ("RobertaForMaskedLM", "roberta.encoder.layer.0.output.LayerNorm.weight"),
    "deit": ("DeiTForImageClassificationWithTeacher", "deit.layers.0.layernorm_before.weight"),
    "gpt_neox": ("GPTNeoXForCausalLM", "gpt_neox.layers.0.input_layernorm.weight"),
    "phi3": ("Phi3ForCausalLM", "model.layers.0.input_layernorm.weight"),
}
FLOAT32_NORMS = {"llama", "gemma3", "mistral", "qwen2", "qwen3", "phi3"}
BROKEN = 1e-2


def plain(directory, cls: str):
    return getattr(hf, cls).from_pretrained(directory, dtype=torch.float64, attn_implementation="sdpa").eval()


@pytest.mark.parametrize("family", sorted(CLASSES))
def test_scrambled_checkpoint_reloaded_by_plain_transformers_gives_the_same_logits(tmp_path, family):
    cls, norm = CLASSES[family]
    model, _ = build_random_model(family, model_class=cls, dtype=torch.float64, seed=4)
    record = save_and_scramble(model, tmp_path, symmetries=["channels", "heads", "head_channels", "mlp", "rotation"])
    assert record["dtype"] == "float64" and record["family"] == family

    original, scrambled = plain(tmp_path / "original", cls), plain(tmp_path / "scrambled", cls)
    assert type(scrambled).__name__ == cls
    assert all(p.dtype == torch.float64 for p in scrambled.parameters())
    inputs = random_inputs(family, model, seed=4)
    inputs = {k: v.to(torch.float64) if v.is_floating_point() else v for k, v in inputs.items()}
    with torch.no_grad():
        want = original(**inputs).logits
        got = scrambled(**inputs).logits
    error = ((got - want).abs().max() / want.abs().max()).item()
    assert error < (1e-5 if family in FLOAT32_NORMS else 1e-12), error
    weights_moved = max(((a - b).abs().max() / a.abs().max()).item()
                        for (name, a), b in zip(original.named_parameters(), scrambled.parameters(), strict=True)
                        if a.shape == b.shape and "norm" not in name.lower())
    assert weights_moved > 0.1  # the checkpoint really is scrambled

    with torch.no_grad():  # negative control: one gain left in the original channel order
        dict(scrambled.named_parameters())[norm].copy_(dict(original.named_parameters())[norm])
        broken = scrambled(**inputs).logits
    assert ((broken - want).abs().max() / want.abs().max()).item() > BROKEN
