"""One adapter per architecture: which Hugging Face parameter has which roles, and nothing else. The registry of
families; the building blocks are in perm_core/families/base.py."""

from __future__ import annotations

from perm_core.families.base import Family, Geometry, UnsupportedModelError

__all__ = ["Family", "Geometry", "UnsupportedModelError", "family_by_name", "family_names", "family_of",
           "geometry_of", "supported_summary"]


def _registry() -> dict[str, Family]:
    from perm_core.families import (
        bert,
        deit,
        dinov2,
        distilbert,
        gemma3,
        gpt2,
        gpt_neox,
        gpt_oss,
        llama,
        mistral,
        mixtral,
        olmoe,
        phi3,
        qwen2,
        qwen2_moe,
        qwen3,
        qwen3_moe,
        roberta,
        t5,
        vit,
    )

    return {fam.FAMILY.name: fam.FAMILY for fam in (vit, bert, gpt2, llama, gemma3, dinov2, gpt_neox, phi3, mistral,
                                                    qwen2, qwen3, distilbert, roberta, deit, t5,
                                                    mixtral, qwen2_moe, qwen3_moe, olmoe, gpt_oss)}


def family_names() -> list[str]:
    """Every supported family, in registry order."""
    return list(_registry())


def supported_summary() -> str:
    return "; ".join(f"{f.name} ({', '.join(f.classes)})" for f in _registry().values())


def family_of(model) -> Family:
    model_type = getattr(model.config, "model_type", None)
    class_name = type(model).__name__
    for family in _registry().values():
        if model_type in family.model_types:
            if class_name not in family.classes:
                break
            return family.for_class(class_name)
    for family in _registry().values():
        reason = family.refusal(class_name)
        if reason:
            raise UnsupportedModelError(f"{class_name} is not supported: {reason}")
    raise UnsupportedModelError(
        f"{class_name} (model_type {model_type!r}) is not supported. Supported: {supported_summary()}."
    )


def geometry_of(model) -> Geometry:
    """The geometry of a supported model (its family read from the model, the numbers from its config)."""
    return family_of(model).geometry(model.config)


def family_by_name(name: str) -> Family:
    registry = _registry()
    if name not in registry:
        raise UnsupportedModelError(f"unknown family {name!r}; supported: {', '.join(registry)}")
    return registry[name]
