"""DINOv2 (transformers 5.x names: encoder.layer.N.attention.{q,k,v,o}_proj, norm1/norm2, layer_scale1/2,
mlp.fc1/fc2 or the SwiGLU mlp.{gate,up,down}_proj).

Layer scale multiplies each residual branch by a per-channel gain (lambda1) before it joins the
stream: a vector on the residual axis, so it moves with the channels like a norm gain. The mask
token replaces masked patch embeddings (pre-training only): a residual vector too. The position
table's axis 1 holds the class token's row first, like ViT's; the class token stays in place.
"""

from perm_core.engine.spec import Concat, Rule
from perm_core.families.base import Family, Geometry
from perm_core.families.stages import StageLayout
from perm_core.families.vit import IMAGE_STAGES, image_tokens, square

P = r"(?:dinov2\.)?"
L = P + r"encoder\.layer\.(?P<layer>\d+)\."


def d_mlp(config) -> int:
    hidden = int(config.hidden_size * config.mlp_ratio)
    if getattr(config, "use_swiglu_ffn", False):
        return (int(hidden * 2 / 3) + 7) // 8 * 8  # Dinov2SwiGLUFFN's hidden size
    return hidden


def geometry(config) -> Geometry:
    d, heads = config.hidden_size, config.num_attention_heads
    return Geometry(d, config.num_hidden_layers, heads, heads, d // heads, d_mlp(config),
                    rope=False, first_token_fixed=True, input_kind="image", patch_size=square(config, "patch_size"),
                    image_tokens=image_tokens(config, 1))


def rules(g: Geometry) -> tuple[Rule, ...]:
    return (
        Rule(P + r"embeddings\.cls_token", (None, None, "resid"), "embedding"),
        Rule(P + r"embeddings\.mask_token", (None, "resid"), "embedding"),
        Rule(P + r"embeddings\.position_embeddings", (None, "positions", "resid"), "position"),
        Rule(P + r"embeddings\.patch_embeddings\.projection\.weight", ("resid", None, None, None), "embedding"),
        Rule(P + r"embeddings\.patch_embeddings\.projection\.bias", ("resid",), "embedding"),
        *(Rule(L + rf"attention\.{x}_proj\.weight", (x, "resid"), f"attn.{x}") for x in "qkv"),
        *(Rule(L + rf"attention\.{x}_proj\.bias", (x,), f"attn.{x}") for x in "qkv"),
        Rule(L + r"attention\.o_proj\.weight", ("resid", "o"), "attn.o"),
        Rule(L + r"attention\.o_proj\.bias", ("resid",), "attn.o"),
        Rule(L + r"norm[12]\.(?:weight|bias)", ("resid",), "norm"),
        Rule(L + r"layer_scale[12]\.lambda1", ("resid",), "layer_scale"),
        Rule(L + r"mlp\.(?:fc1|gate_proj|up_proj)\.weight", ("mlp", "resid"), "mlp.in"),
        Rule(L + r"mlp\.(?:fc1|gate_proj|up_proj)\.bias", ("mlp",), "mlp.in"),
        Rule(L + r"mlp\.(?:fc2|down_proj)\.weight", ("resid", "mlp"), "mlp.out"),
        Rule(L + r"mlp\.(?:fc2|down_proj)\.bias", ("resid",), "mlp.out"),
        Rule(P + r"layernorm\.(?:weight|bias)", ("resid",), "norm"),
        # Dinov2ForImageClassification reads [class token | mean of the patch tokens]: two residual vectors.
        Rule(r"classifier\.weight", (None, Concat((("resid", g.d_model), ("resid", g.d_model)))), "head"),
        Rule(r"classifier\.bias", (None,), "head"),
    )

# pixels -> embeddings -> encoder.layer -> the final layernorm, whose token 0 is the pooled output
STAGES = StageLayout("Dinov2Model", base="", blocks="encoder.layer", heads=(), pooled_token=0, **IMAGE_STAGES)


FAMILY = Family("dinov2", ("dinov2",), ("Dinov2Model", "Dinov2ForImageClassification"), geometry, rules,
                refused=(("Dinov2Backbone", "a backbone returns per-stage feature maps [B, d, h, w] for a "
                          "detection or segmentation model, not a head's output; load Dinov2Model instead"),),
                stages=(STAGES,))
