"""Where a model and its inputs run: "cpu", "cuda" (or "cuda:N") or "mps".

A device this machine lacks is a DeviceError with one line, before anything moves. Apple's mps has no float64,
and every check needs it (a float64 run, or a float32 run's round-off reference in float64), as do compare and
scramble's transforms: mps is refused for that reason where it is present.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

DEVICES = ("cpu", "cuda", "mps")


class DeviceError(ValueError):
    """A device that is unknown, absent on this machine, or unable to run the check: one line."""


def resolve_device(name: str | torch.device) -> torch.device:
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise DeviceError(f"unknown device {name!r}; choose one of {', '.join(DEVICES)}") from None
    if device.type not in DEVICES:
        raise DeviceError(f"unknown device {name!r}; choose one of {', '.join(DEVICES)}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError("cuda is not available on this machine (torch.cuda.is_available() is False: no "
                              "NVIDIA GPU or driver, or a CPU-only torch build)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceError(f"{device} does not exist: this machine has {torch.cuda.device_count()} cuda device(s)")
    if device.type == "mps":
        if not torch.backends.mps.is_available():
            raise DeviceError("mps is not available on this machine (torch.backends.mps.is_available() is False)")
        raise DeviceError("mps has no float64, which every check needs (a float64 run, or the float32 run's "
                          "round-off reference); use cpu")
    return device


def to_device(model: torch.nn.Module, device: str | torch.device) -> torch.nn.Module:
    """The model moved (in place, as nn.Module.to does) to `device`, checked first by resolve_device."""
    return model.to(resolve_device(device))


def inputs_to(inputs: Mapping, device: str | torch.device) -> dict:
    """The inputs with every tensor on `device` (other values, as they are)."""
    target = resolve_device(device)
    return {name: value.to(target) if isinstance(value, torch.Tensor) else value for name, value in inputs.items()}


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def placed(model: torch.nn.Module, inputs: Mapping, device: str | torch.device | None) -> tuple[torch.nn.Module, dict]:
    """The model on `device` (moved in place; None: left where it is) and the inputs on the model's device: a check
    runs where both are."""
    if device is not None:
        model = to_device(model, device)
    return model, inputs_to(inputs, model_device(model))
