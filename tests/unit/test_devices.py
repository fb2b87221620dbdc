"""--device on check, scramble and compare, and device= in the API: a device this machine lacks is one line and exit
2 (cuda here: the CPU path is what these tests pin), and the CPU gives the same report as no --device at all."""

from __future__ import annotations

import json

import pytest
import torch

import perm_core
from perm_core.__main__ import main
from perm_core.models import registry
from perm_core.models.defaults import default_inputs
from perm_core.run.devices import DeviceError, resolve_device

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="pins the refusal on a machine without cuda")


def cli_here(capsys, *args) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@NO_CUDA
@pytest.mark.parametrize("argv", [
    ["check", "random:gpt2"],
    ["check", "digits-vit", "--stream"],
    ["scramble", "random:gpt2", "--symmetry", "mlp", "--key", "1", "--out", "unused"],
    ["compare", "random:gpt2", "random:gpt2"],
])
def test_cuda_on_a_machine_without_it_is_one_line(capsys, argv):
    code, out, err = cli_here(capsys, *argv, "--device", "cuda")
    assert code == 2 and out == ""
    assert err.count("\n") == 1
    assert err.startswith("error: --device cuda: cuda is not available on this machine")


@pytest.mark.parametrize(("device", "message"), [
    ("tpu", "unknown device 'tpu'; choose one of cpu, cuda, mps"),
    ("not a device", "unknown device 'not a device'"),
    ("mps", "mps"),
])
def test_unknown_and_unusable_devices_are_one_line(capsys, device, message):
    code, out, err = cli_here(capsys, "check", "random:gpt2", "--device", device)
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err


def test_the_streamed_commands_refuse_a_device_other_than_the_cpu(capsys, monkeypatch):
    """With cuda present (pretended: the refusal comes before anything would move), --stream stays on the CPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda") == torch.device("cuda")
    code, _, err = cli_here(capsys, "check", "digits-vit", "--stream", "--device", "cuda")
    assert code == 2 and err.count("\n") == 1 and "the streamed check runs on the CPU only" in err
    code, _, err = cli_here(capsys, "scramble", "digits-vit", "--stream", "--symmetry", "mlp", "--key", "1",
                            "--out", "unused", "--device", "cuda:0")
    assert code == 2 and err.count("\n") == 1 and "scramble --stream runs on the CPU only" in err
    code, _, err = cli_here(capsys, "check", "random:gpt2", "--device", "cuda:3")
    assert code == 2 and "cuda:3 does not exist: this machine has 1 cuda device(s)" in err


def test_device_cpu_gives_the_same_reports(capsys, tmp_path):
    argv = ["check", "random:bert", "--symmetry", "channels", "--symmetry", "heads", "--forward-only", "--json"]
    code, plain, err = cli_here(capsys, *argv)
    assert code == 0, err
    code, on_cpu, err = cli_here(capsys, *argv, "--device", "cpu")
    assert code == 0, err
    assert json.loads(on_cpu) == json.loads(plain) and json.loads(plain)["passed"]
    code, other_key, _ = cli_here(capsys, *argv, "--key", "3")  # the control: the comparison sees a change
    assert json.loads(other_key) != json.loads(plain)
    out = tmp_path / "scrambled"
    code, _, err = cli_here(capsys, "scramble", "random:bert", "--symmetry", "channels", "--key", "2", "--out", out,
                            "--device", "cpu")
    assert code == 0, err
    code, compared, err = cli_here(capsys, "compare", "random:bert", out, "--device", "cpu", "--json")
    assert code == 0, err
    code, plain_compared, err = cli_here(capsys, "compare", "random:bert", out, "--json")
    assert json.loads(compared) == json.loads(plain_compared)
    assert json.loads(compared)["verdict"].startswith("same function")


def test_the_api_takes_a_device():
    loaded = registry.load_model("random:gpt2", torch.float64, device="cpu")
    inputs = default_inputs(loaded)
    report = perm_core.check(loaded.model, inputs, ["channels"], key=4, backward=False, device="cpu")
    assert report.passed and report.to_json() == perm_core.check(loaded.model, inputs, ["channels"], key=4,
                                                                 backward=False).to_json()
    weights = perm_core.scramble(loaded.model, ["mlp"], key=4, device="cpu")
    assert all(torch.equal(weights[n], w) for n, w in perm_core.scramble(loaded.model, ["mlp"], key=4).items())
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="cuda is not available on this machine"):
            perm_core.check(loaded.model, inputs, ["channels"], device="cuda")
        with pytest.raises(DeviceError, match="cuda is not available"):
            registry.load_model("random:gpt2", device="cuda")
    assert next(loaded.model.parameters()).device.type == "cpu"  # a refused device moves nothing
