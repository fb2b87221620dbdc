"""Served safely by default: loopback, XSRF on, no traceback to visitors, a stated upload limit, no remote code
(trust_remote_code never on, pickle checkpoints refused without being unpickled)."""

import os
import re
import tomllib
from pathlib import Path

import pytest
import torch

from perm_core.models import registry
from perm_core.models.inputs import MAX_IMAGE_BYTES
from perm_core.models.registry import ModelLoadError

ROOT = Path(__file__).resolve().parents[2]
CONFIG = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
CODE = [p for d in ("perm_core", "ui", "pages", "benchmarks") for p in (ROOT / d).rglob("*.py")] + [ROOT / "app.py"]


def test_the_server_is_loopback_with_xsrf_and_no_error_details():
    assert CONFIG["server"]["address"] == "127.0.0.1"
    assert CONFIG["server"]["enableXsrfProtection"] is True
    assert CONFIG["client"]["showErrorDetails"] == "none"
    run = (ROOT / "Makefile").read_text().split("\nrun:")[1].split("\n\n")[0]
    assert "--server.address 127.0.0.1" in run


def test_the_upload_limit_is_stated_and_matches_the_loader():
    assert CONFIG["server"]["maxUploadSize"] == 20 and 20 * 2**20 == MAX_IMAGE_BYTES


def test_remote_code_is_never_trusted_and_nothing_is_unpickled():
    assert len(CODE) > 30
    for path in CODE:
        text = path.read_text()
        for setting in re.findall(r"trust_remote_code\s*=\s*([^,)\s]+)", text):
            assert setting == "False", f"{path}: trust_remote_code={setting}"
        assert not re.search(r"\btorch\.load\(|\bpickle\.loads?\(|\bjoblib\.load\(", text), path


class _Payload:
    """Unpickling this runs os.system: proof that a loader unpickled the file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_pickle_checkpoint_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "the-pickle-ran"
    model = registry.load_model("digits-vit").model
    model.config.save_pretrained(tmp_path / "only-pickle")
    torch.save({"payload": _Payload(marker)}, tmp_path / "only-pickle" / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="pickle weights .*pytorch_model.bin.* can run code"):
        registry.load_model(str(tmp_path / "only-pickle"))
    assert not marker.exists()

    # Beside safetensors weights, a pickle is ignored: the model loads from the safetensors, the pickle never runs.
    model.save_pretrained(tmp_path / "both", safe_serialization=True)
    torch.save({"payload": _Payload(marker)}, tmp_path / "both" / "pytorch_model.bin")
    loaded = registry.load_model(str(tmp_path / "both"))
    assert not marker.exists()
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[name], tensor), name

    # Control: the payload is live, so its absence above means nothing unpickled it.
    torch.load(tmp_path / "both" / "pytorch_model.bin", weights_only=False)
    assert marker.exists()
