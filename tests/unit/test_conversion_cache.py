"""The converted-model cache: built beside its place and renamed in, so nothing half-written is ever read."""

import json

import pytest

from perm_core.models import conversion_cache


def writes_model(checkpoint, scratch):
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    (scratch / "joined.gguf").write_bytes(b"source")  # scratch: deleted with the temporary directory
    return {"source_bytes": 6}


def test_a_conversion_lands_complete_and_leaves_nothing_else(tmp_path):
    target = tmp_path / "model-v1-6"
    seconds = conversion_cache.convert_into(target, writes_model)
    assert conversion_cache.is_complete(target) and seconds >= 0
    assert json.loads((target / "complete.json").read_text())["source_bytes"] == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model-v1-6"]
    assert sorted(p.name for p in target.iterdir()) == ["complete.json", "model.safetensors"]


def test_an_interrupted_conversion_leaves_nothing(tmp_path):
    def crashes(checkpoint, scratch):
        writes_model(checkpoint, scratch)
        raise RuntimeError("simulated crash")

    with pytest.raises(RuntimeError, match="simulated crash"):
        conversion_cache.convert_into(tmp_path / "model", crashes)
    assert list(tmp_path.iterdir()) == []


def test_a_directory_without_its_marker_is_rebuilt_and_a_complete_one_is_kept(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "model.safetensors").write_bytes(b"half")  # no complete.json: an interrupted or foreign directory
    calls = []
    convert = lambda: calls.append(1) or conversion_cache.convert_into(target, writes_model)  # noqa: E731
    assert conversion_cache.ensure_converted(target, convert) == target and calls == [1]
    assert (target / "model.safetensors").read_bytes() == b"weights"
    conversion_cache.ensure_converted(target, convert)
    assert calls == [1]  # complete: not converted again


def test_losing_the_race_to_another_process_is_not_an_error(tmp_path):
    target = tmp_path / "model"

    def another_process_wins(checkpoint, scratch):
        conversion_cache.convert_into(target, writes_model)  # lands first: this rename then fails
        return writes_model(checkpoint, scratch)

    conversion_cache.convert_into(target, another_process_wins)
    assert conversion_cache.is_complete(target) and [p.name for p in tmp_path.iterdir()] == ["model"]


def test_the_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TRANSFORMER_SYMMETRY_CACHE", str(tmp_path / "explicit"))
    assert conversion_cache.cache_root() == tmp_path / "explicit"
    monkeypatch.delenv("TRANSFORMER_SYMMETRY_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert conversion_cache.cache_root() == tmp_path / "xdg" / "transformer-symmetry-explorer"


def small_gguf(path):
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_array("tokenizer.ggml.tokens", [f"token{i}" for i in range(50)])
    writer.add_tensor("token_embd.weight", np.arange(8, dtype=np.float32).reshape(2, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_gguf_is_parsed_once_within_a_conversion_and_afresh_outside_it(tmp_path):
    import gguf

    path = small_gguf(tmp_path / "small.gguf")
    original = gguf.GGUFReader
    with conversion_cache.gguf_parsed_once():
        first, again = gguf.GGUFReader(path), gguf.GGUFReader(str(path))
        other = gguf.GGUFReader(small_gguf(tmp_path / "other.gguf"))
        assert first is again and other is not first
        assert first.fields["tokenizer.ggml.tokens"].contents() == [f"token{i}" for i in range(50)]
        assert first.tensors[0].data.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert gguf.GGUFReader is original
    assert gguf.GGUFReader(path) is not gguf.GGUFReader(path)  # the control: outside, every reader parses anew
    with pytest.raises(RuntimeError), conversion_cache.gguf_parsed_once():
        raise RuntimeError("a failed conversion")
    assert gguf.GGUFReader is original
