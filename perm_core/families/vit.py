"""ViT (transformers 5.x names: vit.layers.N.attention.{q,k,v,o}_proj, mlp.fc1/fc2)."""

from perm_core.engine.spec import Rule
from perm_core.families.base import Family, Geometry, UnsupportedModelError
from perm_core.families.stages import Head, StageLayout

P = r"(?:vit\.)?"


def geometry(config) -> Geometry:
    d, heads = config.hidden_size, config.num_attention_heads
    return Geometry(d, config.num_hidden_layers, heads, heads, d // heads, config.intermediate_size,
                    rope=False, first_token_fixed=True, input_kind="image", patch_size=square(config, "patch_size"),
                    image_tokens=image_tokens(config, 1))


def square(config, name: str) -> int:
    """An image or patch size given as one number (or a square pair): inputs are drawn as square images."""
    size = getattr(config, name)
    if isinstance(size, (list, tuple)):
        if len(size) != 2 or size[0] != size[1]:
            raise UnsupportedModelError(f"a non-square {name} ({list(size)}) is not supported: images are square here")
        size = size[0]
    return int(size)


def image_tokens(config, fixed: int) -> int:
    """The tokens the position table holds: the whole patches of config.image_size (the patch embedding's
    strided convolution drops a remainder), and the `fixed` leading tokens."""
    side = square(config, "image_size") // square(config, "patch_size")
    if side < 1:
        raise UnsupportedModelError(f"an image size of {square(config, 'image_size')} holds no patch of "
                                    f"{square(config, 'patch_size')}")
    return side * side + fixed


def body_rules(prefix: str) -> tuple[Rule, ...]:
    """Patch embedding, blocks, final norm and pooler under `prefix.` (ViT's layout, shared by DeiT)."""
    p = rf"(?:{prefix}\.)?"
    layer = p + r"layers\.(?P<layer>\d+)\."
    return (
        Rule(p + r"embeddings\.position_embeddings", (None, "positions", "resid"), "position"),
        Rule(p + r"embeddings\.patch_embeddings\.projection\.weight", ("resid", None, None, None), "embedding"),
        Rule(p + r"embeddings\.patch_embeddings\.projection\.bias", ("resid",), "embedding"),
        *(Rule(layer + rf"attention\.{x}_proj\.weight", (x, "resid"), f"attn.{x}") for x in "qkv"),
        *(Rule(layer + rf"attention\.{x}_proj\.bias", (x,), f"attn.{x}") for x in "qkv"),
        Rule(layer + r"attention\.o_proj\.weight", ("resid", "o"), "attn.o"),
        Rule(layer + r"attention\.o_proj\.bias", ("resid",), "attn.o"),
        Rule(layer + r"layernorm_(?:before|after)\.(?:weight|bias)", ("resid",), "norm"),
        Rule(layer + r"mlp\.fc1\.weight", ("mlp", "resid"), "mlp.in"),
        Rule(layer + r"mlp\.fc1\.bias", ("mlp",), "mlp.in"),
        Rule(layer + r"mlp\.fc2\.weight", ("resid", "mlp"), "mlp.out"),
        Rule(layer + r"mlp\.fc2\.bias", ("resid",), "mlp.out"),
        Rule(p + r"layernorm\.(?:weight|bias)", ("resid",), "norm"),
        Rule(p + r"pooler\.dense\.weight", ("resid", "resid"), "head"),
        Rule(p + r"pooler\.dense\.bias", ("resid",), "head"),
    )


def rules(g: Geometry) -> tuple[Rule, ...]:
    return (
        Rule(P + r"embeddings\.cls_token", (None, None, "resid"), "embedding"),
        *body_rules("vit"),
        Rule(r"classifier\.weight", (None, "resid"), "head"),
        Rule(r"classifier\.bias", (None,), "head"),
    )


MASKED_IMAGE_MODELING = ("a masked-image-modeling head (pre-training: it reconstructs the pixels of masked "
                         "patches from bool_masked_pos) has no symmetry spec here; supported: the model and its "
                         "image classifier")

# pixels -> patch projection, [CLS] token (DeiT's distillation token beside it) and position table -> layers -> the
# final layernorm (it opens the head: the trace's last hidden state is the last block's own output)
IMAGE_STAGES = {"attention": "attention", "token_embedding": None, "final_norm": "layernorm", "norm_opens_head": True}
CLASSIFIER = (Head(("classifier",), token=0),)  # its rows, the labels, run as a vocabulary's are
STAGES = StageLayout("ViTForImageClassification", base="vit", heads=CLASSIFIER, **IMAGE_STAGES)


FAMILY = Family("vit", ("vit",), ("ViTModel", "ViTForImageClassification"), geometry, rules,
                refused=(("ViTForMaskedImageModeling", MASKED_IMAGE_MODELING),),
                stages=(STAGES,))
