"""DeiT (transformers 5.x names: deit.layers.N.attention.{q,k,v,o}_proj, mlp.fc1/fc2): ViT plus a distillation
token. The sequence is [class, distillation, patches...]; the heads read tokens 0 and 1 by index, so both stay
in place under token permutation (Geometry.fixed_tokens = 2) and only the patches are shuffled."""

from perm_core.engine.spec import Rule
from perm_core.families.base import Family, Geometry, UnsupportedModelError
from perm_core.families.stages import Head, StageLayout
from perm_core.families.vit import CLASSIFIER, IMAGE_STAGES, MASKED_IMAGE_MODELING, body_rules, image_tokens, square

P = r"(?:deit\.)?"


def geometry(config) -> Geometry:
    d, heads = config.hidden_size, config.num_attention_heads
    if (getattr(config, "pooler_output_size", None) or d) != d:
        raise UnsupportedModelError("a DeiT pooler whose output is not the width of the residual stream")
    return Geometry(d, config.num_hidden_layers, heads, heads, d // heads, config.intermediate_size,
                    rope=False, first_token_fixed=True, input_kind="image", patch_size=square(config, "patch_size"),
                    fixed_tokens=2, image_tokens=image_tokens(config, 2))


def rules(g: Geometry) -> tuple[Rule, ...]:
    return (
        Rule(P + r"embeddings\.(?:cls|distillation)_token", (None, None, "resid"), "embedding"),
        Rule(P + r"embeddings\.mask_token", (None, None, "resid"), "embedding"),
        *body_rules("deit"),  # DeiTModel's pooler: token 0, dense, tanh
        # DeiTForImageClassification reads token 0; ...WithTeacher averages cls_classifier(token 0) and
        # distillation_classifier(token 1).
        Rule(r"(?:cls_|distillation_)?classifier\.weight", (None, "resid"), "head"),
        Rule(r"(?:cls_|distillation_)?classifier\.bias", (None,), "head"),
    )

STAGES = (
    # the teacher class: a classifier on the [CLS] token and one on the distillation token, the logits their mean;
    # the trace records all three (the logits, cls_logits and distillation_logits fields)
    StageLayout("DeiTForImageClassificationWithTeacher", base="deit", logits_mean=True,
                heads=(Head(("cls_classifier",), token=0, output="cls_logits"),
                       Head(("distillation_classifier",), token=1, output="distillation_logits")),
                **IMAGE_STAGES),
    StageLayout("DeiTForImageClassification", base="deit", heads=CLASSIFIER, **IMAGE_STAGES))  # one classifier


FAMILY = Family("deit", ("deit",), ("DeiTModel", "DeiTForImageClassification",
                                    "DeiTForImageClassificationWithTeacher"), geometry, rules,
                refused=(("DeiTForMaskedImageModeling", MASKED_IMAGE_MODELING),),
                stages=STAGES)
