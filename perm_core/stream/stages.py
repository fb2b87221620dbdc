"""Which checkpoints the streamed check runs, read from the families' own declarations (Family.stages, in each
family's file): the family, the transformers class and where that class keeps its stages. Nothing here names a
family or a class.
"""

from __future__ import annotations

import json
from pathlib import Path

from perm_core.families import Family, family_by_name, family_names
from perm_core.families.stages import EncoderDecoderLayout, StageLayout
from perm_core.stream.shards import CheckpointError


class StreamingUnsupportedError(CheckpointError):
    """A checkpoint of an architecture the streamed check does not run."""


def streamed_families() -> tuple[str, ...]:
    """Every family with at least one streamed class, in the families' registry order."""
    return tuple(name for name in family_names() if family_by_name(name).stages)


def is_encoder_decoder(directory) -> bool:
    """Whether a checkpoint directory's config names an encoder-decoder (read before anything is built; an
    unreadable one is not, and the stages that read it say why)."""
    try:
        raw = json.loads((Path(directory).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(raw, dict) and bool(raw.get("is_encoder_decoder"))


def supported_summary() -> str:
    families = [family_by_name(name) for name in streamed_families()]
    # a layout named by how its class's name ends ("For...") streams that class of each family declaring it
    ends: dict[str, list[str]] = {}
    for f in families:
        for layout in f.stages:
            if layout.head_class.startswith("For"):
                ends.setdefault(layout.head_class, []).append(f.name)
    others = [f"{layout.head_class} ({f.name})" for f in families for layout in f.stages
              if not layout.head_class.startswith("For")]
    return "; ".join([f"*{end} of {', '.join(names)}" for end, names in ends.items()] + others)


def family_for(config: dict, kind: type[StageLayout | EncoderDecoderLayout] = StageLayout
               ) -> tuple[Family, type, StageLayout | EncoderDecoderLayout]:
    """The family, the transformers class and the stage layout of a checkpoint's config: a streamed class of a
    streamed family, its layout of `kind` (one stack, or an encoder-decoder's two); a config without architectures,
    as the zoo's converted caches write it, is streamed as the family's first class of that kind."""
    import transformers

    model_type = config.get("model_type")
    architectures = config.get("architectures") or []
    name = architectures[0] if architectures and isinstance(architectures[0], str) else ""
    found = next((f for f in streamed_families() if model_type in family_by_name(f).model_types), None)
    family = family_by_name(found) if found is not None else None
    layouts = tuple(lay for lay in family.stages if isinstance(lay, kind)) if family is not None else ()
    layout = next((lay for lay in layouts if name and name.endswith(lay.head_class)), layouts[0] if layouts else None)
    if not name and family is not None:
        name = next(c for c in family.classes if c.endswith(layout.head_class))
    cls = getattr(transformers, name, None) if name.isidentifier() else None
    if layout is None or not name.endswith(layout.head_class) or name not in family.classes or cls is None:
        raise StreamingUnsupportedError(
            f"streaming supports {supported_summary()}; this checkpoint is {name or 'an unnamed class'} "
            f"(model_type {model_type!r})")
    return family.for_class(name), cls, layout
