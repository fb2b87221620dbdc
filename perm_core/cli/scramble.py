"""python -m perm_core scramble MODEL --symmetry NAME ... --key N --out DIR

Writes a function-identical model with different weights (save_pretrained, safetensors) and a
key.json recording the transforms, loadable by plain transformers. The weights are written in the dtype the
checkpoint was stored in (a local directory; float32 for zoo and random models) unless --dtype says otherwise,
each transformed in float64 and rounded once to that dtype; a sharded checkpoint is written in the same shards.
"""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path

import torch

from perm_core.cli import (
    DTYPES,
    UsageError,
    add_model_options,
    device_or_usage_error,
    host_only_when_streaming,
    key_or_usage_error,
    largest_shard_bytes,
    load_or_usage_error,
    stored_dtype,
)
from perm_core.engine.symmetries import DESCRIPTIONS, WEIGHT_SYMMETRIES
from perm_core.schemas import SCHEMA_VERSION

WRITE_DTYPES = {**DTYPES, "bfloat16": torch.bfloat16, "float16": torch.float16}


def register(sub) -> None:
    parser = sub.add_parser("scramble", help="write a function-identical model with transformed weights")
    parser.add_argument("model", help="zoo name, random:FAMILY, a Hugging Face checkpoint (org/name), or a "
                                      "save_pretrained directory")
    parser.add_argument("--symmetry", action="append", required=True,
                        help=f"repeatable; one of {', '.join(WEIGHT_SYMMETRIES)} (tokens act on inputs, not weights)")
    parser.add_argument("--key", type=str, required=True)
    parser.add_argument("--dtype", choices=WRITE_DTYPES,
                        help="dtype of the written weights (default: the one the checkpoint is stored in, float32 "
                             "for zoo and random models)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--stream", action="store_true",
                        help="transform the checkpoint's shards one tensor at a time (same shards and index)")
    add_model_options(parser)
    parser.set_defaults(run=run)


def run(args) -> int:
    from perm_core.verify.same_function import dtype_name
    from perm_core.verify.subject import Subject

    bad = [name for name in args.symmetry if name not in WEIGHT_SYMMETRIES]
    if bad:
        raise UsageError(f"cannot scramble weights with {', '.join(bad)}: only {', '.join(WEIGHT_SYMMETRIES)} "
                         "change weights alone (tokens permute the input)")
    key = key_or_usage_error(args.key)
    device_or_usage_error(args.device)
    if args.stream:
        host_only_when_streaming(args.device, "scramble --stream", "scramble the whole model")
        return run_streamed(args, key)
    stored = stored_dtype(args.model, args.revision)
    dtype = WRITE_DTYPES[args.dtype] if args.dtype else stored or torch.float32
    # float32 holds bfloat16 and float16 weights exactly; float64 ones only in float64
    loaded = load_or_usage_error(args.model, torch.float64 if torch.float64 in (dtype, stored) else torch.float32,
                                 args.revision, args.device)
    subject = Subject(loaded.model)
    scramble = subject.build({name: key for name in args.symmetry})
    out = Path(args.out)
    write_scrambled(loaded, rounded_once(subject, scramble, dtype), out,
                    largest_shard_bytes(args.model, dtype, args.revision))
    write_key_file(out, args, subject.family.name, type(loaded.model).__name__, key, dtype_name(dtype),
                   dtype_name(stored), reproduce_command(args.model, args.symmetry, key, dtype_name(dtype), out,
                                                         commit_of(args.model, args.revision)))
    print(f"wrote {args.out}: {args.model} scrambled by {', '.join(args.symmetry)} with key {key}")
    return 0


def run_streamed(args, key: int) -> int:
    """scramble --stream: perm_core.stream.scramble writes each shard tensor by tensor (floating tensors in --dtype,
    else each in the dtype it is stored in)."""
    from perm_core.cli._streamed import checkpoint_directory
    from perm_core.stream.scramble import stream_scramble
    from perm_core.stream.shards import CheckpointError
    from perm_core.verify.same_function import dtype_name

    directory = checkpoint_directory(args.model, args.revision)
    if directory is None:
        raise UsageError(f"--stream reads a checkpoint directory of safetensors shards; {args.model} is none")
    out = Path(args.out)
    if out.expanduser().resolve() == directory.resolve():
        raise UsageError("--out must differ from the checkpoint directory")
    dtype = WRITE_DTYPES[args.dtype] if args.dtype else None
    try:
        model = stream_scramble(directory, {name: key for name in args.symmetry}, out, dtype)
    except (CheckpointError, OSError) as error:
        raise UsageError(str(error).splitlines()[0]) from None
    stored = stored_dtype(str(directory))
    written = dtype_name(dtype or stored)
    write_key_file(out, args, model.family.name, model.cls_name, key, written, dtype_name(stored),
                   reproduce_command(args.model, args.symmetry, key, written, out,
                                     commit_of(args.model, args.revision)) + " --stream")
    print(f"wrote {args.out}: {args.model} scrambled by {', '.join(args.symmetry)} with key {key} (streamed)")
    return 0


def write_key_file(out: Path, args, family: str, cls: str, key: int, dtype: str, stored: str | None,
                   reproduce: str) -> None:
    """key.json beside the checkpoint: what was transformed, with which key, and the command that writes it
    again (its schema: perm_core/schemas/scramble_keys.json)."""
    record = {"schema_version": SCHEMA_VERSION, "model": args.model, "family": family, "class": cls, "key": key,
              "dtype": dtype, "stored_dtype": stored,
              "symmetries": {name: DESCRIPTIONS[name] for name in args.symmetry}, "reproduce": reproduce}
    (out / "key.json").write_text(json.dumps(record, indent=2))


def rounded_once(subject, scramble, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Each parameter transformed in float64 and rounded once to `dtype`, one tensor at a time: a written weight
    is then within dtype's unit round-off of its exact value (relative to itself), which `compare` relies on; the
    same maps applied in float32 are off by up to 9 float32 unit round-offs of the tensor's scale (head_dim 256)."""
    from perm_core.engine.spec import transform_param

    return {name: transform_param(p.detach().to(torch.float64), subject.claims[name], scramble).to(dtype)
            for name, p in subject.params.items()}


def commit_of(model: str, revision: str | None) -> str | None:
    """The commit a Hugging Face name resolved to (its snapshot directory's name); None for any other name."""
    from perm_core.cli import local_directory
    from perm_core.models.hub_checkpoints import is_hub_name

    directory = local_directory(model, revision) if is_hub_name(model) else None
    return None if directory is None else directory.name


def reproduce_command(model: str, symmetry_names, key: int, dtype: str, out: Path, commit: str | None = None) -> str:
    """A shell line that writes the same checkpoint again (local paths made absolute, so any cwd works; a Hugging
    Face checkpoint pinned to the commit it was read at)."""
    from perm_core.models.hub import looks_like_path
    from perm_core.models.hub_checkpoints import is_hub_name

    model_arg = str(Path(model).expanduser().resolve()) if looks_like_path(model) and not is_hub_name(model) else model
    words = ["python", "-m", "perm_core", "scramble", model_arg, *(["--revision", commit] if commit else [])]
    for name in symmetry_names:
        words += ["--symmetry", name]
    words += ["--key", str(key), "--dtype", dtype, "--out", str(out.expanduser().resolve())]
    return shlex.join(words)


def write_scrambled(loaded, params: dict[str, torch.Tensor], out: Path, max_shard_size: int | None = None) -> None:
    """A fresh copy of the architecture, in the dtype of `params`, holds the new weights; the shared model is never
    touched. Written alongside: its config and generation config, and its tokenizer or image processor only
    when the source had one. max_shard_size: the source's largest shard (see largest_shard_bytes), else one file."""
    source = loaded.model
    dtype = next(iter(params.values())).dtype
    config = copy.deepcopy(source.config)
    config._attn_implementation = "eager"  # perm_core's own attention is not registered for other readers
    model = type(source)(config).to(dtype)  # built in float32 by default: float64 weights must not be rounded
    missing, unexpected = model.load_state_dict({n: p.detach() for n, p in params.items()}, strict=False)
    model.tie_weights()
    if unexpected:
        raise UsageError(f"unexpected parameters when writing: {unexpected[:3]}")
    fresh = dict(model.named_parameters(remove_duplicate=False))
    written = {fresh[name].data_ptr() for name in params if name in fresh}
    untouched = [name for name in missing if name in fresh and fresh[name].data_ptr() not in written]
    if untouched:
        raise UsageError(f"parameters left at their fresh initialization when writing: {untouched[:3]}")
    if getattr(source, "generation_config", None) is not None and getattr(model, "generation_config", None) is not None:
        model.generation_config = copy.deepcopy(source.generation_config)
    if max_shard_size is None:
        model.save_pretrained(out, safe_serialization=True)
    else:
        model.save_pretrained(out, safe_serialization=True, max_shard_size=max_shard_size)
    if loaded.tokenizer is not None:
        loaded.tokenizer.save_pretrained(out)
    if getattr(loaded, "image_processor", None) is not None:
        loaded.image_processor.save_pretrained(out)
