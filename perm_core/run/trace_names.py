"""The one naming scheme for traced tensors: every name a trace records is built here from its parts, and every reader
takes a name apart here (as TransformerLens's get_act_name does for its hook points).

  embed                      the embedding output fed to block 0
  decoder.embed              an encoder-decoder's decoder embedding output (the decoder stack's embed)
  blocks.{i}.hidden          the residual stream after block i
  blocks.{i}.attn            attention probabilities of block i
  blocks.{i}.cross_attn      an encoder-decoder's cross-attention in block i
  output.{field}             a head's output: output.logits, output.pooler, output.last_hidden, output.start_logits, ...
  grad.input                 d loss / d the model's input (pixels; a text model's embedding output)
  grad.{name}                d loss / d the forward tensor `name`: grad.blocks.{i}.hidden, grad.embed, ...
  grad.param.{parameter}     d loss / d a parameter, under its own dotted name

An encoder-decoder numbers its blocks through both stacks, encoder first (as Rule.layer_offset does), so a block's
name needs no stack. The names are a format that reports, JSON, URLs, tests and the pages read: parse(build(x)) == x
and build(parse(name)) == name for every name a trace records.
"""

from __future__ import annotations

from dataclasses import dataclass

EMBED = "embed"
DECODER = "decoder"  # the one stack besides the encoder's (or the only one's) that has its own names
BLOCK_PARTS = ("hidden", "attn", "cross_attn")
KINDS = ("embed", *BLOCK_PARTS, "output", "input", "param")  # input and param: gradients only

_BLOCKS, _OUTPUT, _GRAD, _PARAM, _INPUT = "blocks.", "output.", "grad.", "param.", "input"


@dataclass(frozen=True)
class TracedName:
    """A traced tensor's name taken apart. kind: one of KINDS; layer: a block's index (block kinds only); stack:
    DECODER for the decoder's embedding, else ""; field: an output's field or a parameter's name; grad: the name is
    of d loss / d that tensor."""

    kind: str
    layer: int | None = None
    stack: str = ""
    field: str = ""
    grad: bool = False

    def __post_init__(self):
        if self.kind not in KINDS or (self.kind in ("input", "param") and not self.grad) \
                or (self.layer is not None) != (self.kind in BLOCK_PARTS) or (self.stack and self.kind != "embed") \
                or self.stack not in ("", DECODER) or bool(self.field) != (self.kind in ("output", "param")):
            raise ValueError(f"no traced tensor is named by {self!r}")

    def __str__(self) -> str:
        return build(self)


def embed(stack: str = "") -> str:
    """The embedding output of `stack` ("" or DECODER)."""
    return f"{stack}.{EMBED}" if stack else EMBED


def block(layer: int, part: str) -> str:
    """Block `layer`'s tensor `part` (one of BLOCK_PARTS)."""
    if part not in BLOCK_PARTS:
        raise ValueError(f"a block records no {part!r}")
    return f"{_BLOCKS}{layer}.{part}"


def hidden(layer: int) -> str:
    return block(layer, "hidden")


def attn(layer: int) -> str:
    return block(layer, "attn")


def cross_attn(layer: int) -> str:
    return block(layer, "cross_attn")


def output(field: str) -> str:
    """A head's output, named after its field (logits, start_logits, ...; pooler and last_hidden for the base's)."""
    return f"{_OUTPUT}{field}"


def grad(name: str) -> str:
    """d loss / d the forward tensor `name`."""
    return f"{_GRAD}{name}"


def param_grad(parameter: str) -> str:
    """d loss / d the parameter `parameter`."""
    return f"{_GRAD}{_PARAM}{parameter}"


DECODER_EMBED = embed(DECODER)
GRAD_INPUT = grad(_INPUT)
LOGITS, POOLER, LAST_HIDDEN = output("logits"), output("pooler"), output("last_hidden")


def is_grad(name: str) -> bool:
    return name.startswith(_GRAD)


def is_param_grad(name: str) -> bool:
    return name.startswith(_GRAD + _PARAM)


def is_output(name: str) -> bool:
    return name.startswith(_OUTPUT)


def differentiated(name: str) -> str:
    """What a gradient's name is the gradient of: a parameter's name, a forward tensor's name or "input"."""
    return name.removeprefix(_GRAD + _PARAM).removeprefix(_GRAD)


def parse(name: str) -> TracedName:
    """`name` taken apart; ValueError where no trace records such a name."""
    gradient = is_grad(name)
    rest = name.removeprefix(_GRAD) if gradient else name
    if gradient and rest == _INPUT:
        return TracedName("input", grad=True)
    if gradient and rest.startswith(_PARAM) and rest != _PARAM:
        return TracedName("param", field=rest.removeprefix(_PARAM), grad=True)
    if rest in (EMBED, DECODER_EMBED):
        return TracedName("embed", stack="" if rest == EMBED else DECODER, grad=gradient)
    if rest.startswith(_OUTPUT) and rest != _OUTPUT:
        return TracedName("output", field=rest.removeprefix(_OUTPUT), grad=gradient)
    if rest.startswith(_BLOCKS):
        index, _, part = rest.removeprefix(_BLOCKS).partition(".")
        if index.isascii() and index.isdigit() and str(int(index)) == index and part in BLOCK_PARTS:
            return TracedName(part, int(index), grad=gradient)
    raise ValueError(f"{name!r} is not a traced tensor's name")


def build(parts: TracedName) -> str:
    """The name of `parts`: build(parse(name)) == name."""
    if parts.kind == "param":
        return param_grad(parts.field)
    if parts.kind == "input":
        return GRAD_INPUT
    if parts.kind == "embed":
        forward = embed(parts.stack)
    elif parts.kind == "output":
        forward = output(parts.field)
    else:
        forward = block(parts.layer, parts.kind)
    return grad(forward) if parts.grad else forward


def layer_of(name: str) -> int | None:
    """The block a forward or gradient name of a block belongs to; None for every other name."""
    return parse(name).layer


def is_residual(name: str) -> bool:
    """The residual stream: an embedding output or a block's hidden state (not their gradients)."""
    parsed = parse(name)
    return parsed.kind in ("embed", "hidden") and not parsed.grad
