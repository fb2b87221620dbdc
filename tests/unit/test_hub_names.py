"""Any Hugging Face checkpoint by its name, offline: resolved from a hub cache written here in huggingface_hub's own
layout (refs/<branch> holding a commit, snapshots/<commit>/<file> linked to blobs/<sha256>), at a --revision too;
a name the cache lacks fails in one line. Online, only config, tokenizer and safetensors files are fetched (a
stand-in for snapshot_download serves a repository that also holds code, pickles and an extra safetensors file)."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants

from perm_core.__main__ import main
from perm_core.models import hub, hub_checkpoints, registry
from perm_core.models.random_models import build_random_model
from perm_core.models.record import ModelLoadError
from tests.unit.test_local_checkpoints import save_tokenizer

ROOT = Path(__file__).resolve().parents[2]
GPT2 = "someorg/tiny-gpt2"
CLASSIFIER = "otherorg/tiny-bert-classifier"
MAIN_COMMIT, OTHER_COMMIT, CLASSIFIER_COMMIT = "a" * 40, "b" * 40, "c" * 40
ABSENT = "is neither a local directory nor in the local Hugging Face cache"


def saved(directory: Path, family: str, seed: int, model_class: str | None = None) -> dict[str, torch.Tensor]:
    """A random model (norms, biases, positions far from their init) saved with a tokenizer: its parameters."""
    model, _ = build_random_model(family, seed=seed, model_class=model_class)
    model.config._attn_implementation = "eager"
    model.save_pretrained(directory, safe_serialization=True)
    save_tokenizer(directory)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def cache_snapshot(cache: Path, repo_id: str, commit: str, files: Path, refs: tuple[str, ...]) -> Path:
    """The files of `files` as huggingface_hub stores a download: blobs by content hash, the snapshot's entries
    relative links to them, and each ref a file holding the commit."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for path in sorted(files.iterdir()):
        blob = repo / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
        shutil.copyfile(path, blob)
        (snapshot / path.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    """someorg/tiny-gpt2 at main (seed 1) and at the branch `other` (seed 2), and a BERT sequence classifier."""
    root = tmp_path_factory.mktemp("hf")
    cache, weights = root / "hub", {}
    for commit, seed, refs in ((MAIN_COMMIT, 1, ("main",)), (OTHER_COMMIT, 2, ("other",))):
        weights[commit] = saved(root / commit, "gpt2", seed)
        cache_snapshot(cache, GPT2, commit, root / commit, refs)
    weights[CLASSIFIER_COMMIT] = saved(root / "bert", "bert", 3, "BertForSequenceClassification")
    cache_snapshot(cache, CLASSIFIER, CLASSIFIER_COMMIT, root / "bert", ("main",))
    return root, cache, weights


@pytest.fixture
def offline_cache(hub_cache, monkeypatch):
    """The cache in place of the user's, offline, for this process's huggingface_hub (its constants are read at
    import, so the variables alone reach only a new process)."""
    root, cache, weights = hub_cache
    monkeypatch.setenv("HF_HOME", str(root))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache, weights


def cli_here(capsys, *args) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def in_a_process(cache: Path, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HOME": str(cache.parent), "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "perm_core", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)


def test_a_cached_name_is_checked_offline_in_a_process_and_an_absent_one_fails_in_one_line(hub_cache):
    _, cache, _ = hub_cache
    result = in_a_process(cache, "check", GPT2, "--forward-only", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["model"], report["family"], report["passed"]) == (GPT2, "gpt2", True)
    assert report["stored_dtype"] == "float32"  # read from the snapshot's safetensors header
    assert all(c["passed"] for c in report["checks"]) and all(c["broken"] for c in report["controls"])
    absent = in_a_process(cache, "check", "someorg/not-cached")
    assert absent.returncode == 2 and absent.stdout == ""
    assert absent.stderr.count("\n") == 1 and "Traceback" not in absent.stderr
    assert absent.stderr.startswith(f"error: someorg/not-cached {ABSENT}")
    assert str(cache) in absent.stderr and "offline" in absent.stderr


def test_a_name_loads_the_snapshot_its_ref_points_at(offline_cache):
    _, weights = offline_cache
    loaded = registry.load_model(GPT2, torch.float32)
    assert (loaded.info.name, loaded.info.source, loaded.info.family) == (GPT2, "hub", "gpt2")
    assert type(loaded.model).__name__ == "GPT2LMHeadModel" and loaded.tokenizer is not None
    params = dict(loaded.model.named_parameters())
    for name in ("transformer.h.0.ln_1.weight", "transformer.h.1.attn.c_attn.bias", "transformer.wpe.weight"):
        assert torch.equal(params[name], weights[MAIN_COMMIT][name]), name
    ln = params["transformer.h.0.ln_1.weight"]
    assert (ln - 1).abs().max() > 0.1  # a non-trivial norm gain, not HF's init
    assert not torch.equal(ln, weights[OTHER_COMMIT]["transformer.h.0.ln_1.weight"])  # the revisions differ


@pytest.mark.parametrize("revision", ["other", OTHER_COMMIT])
def test_a_revision_loads_the_other_snapshot(offline_cache, revision):
    _, weights = offline_cache
    params = dict(registry.load_model(GPT2, torch.float32, revision=revision).model.named_parameters())
    for name in ("transformer.h.0.ln_1.weight", "transformer.h.1.mlp.c_fc.weight", "transformer.wpe.weight"):
        assert torch.equal(params[name], weights[OTHER_COMMIT][name]), name
        assert not torch.equal(params[name], weights[MAIN_COMMIT][name]), name


def test_the_cli_reads_the_revision_asked_for(offline_cache, capsys, tmp_path):
    """scramble --revision other pins the commit it read; compare finds the scrambled copy the same function as
    that revision, and a different function from main (the control: the revision really chose other weights)."""
    out = tmp_path / "scrambled"
    code, _, err = cli_here(capsys, "scramble", GPT2, "--revision", "other", "--symmetry", "channels",
                            "--symmetry", "mlp", "--key", "5", "--out", out)
    assert code == 0, err
    record = json.loads((out / "key.json").read_text())
    assert record["model"] == GPT2 and f"--revision {OTHER_COMMIT}" in record["reproduce"]
    code, report, err = cli_here(capsys, "compare", GPT2, out, "--revision-a", "other", "--json")
    assert code == 0, err
    report = json.loads(report)
    assert report["same_function"] and report["verdict"].startswith("same function") and "not" not in report["verdict"]
    assert report["recovered"]["channels"]["moved"] > 0 and report["recovered"]["mlp"]["moved"] > 0
    code, report, err = cli_here(capsys, "compare", GPT2, out, "--json")  # main against a scrambled `other`
    assert code == 1, err
    assert json.loads(report)["verdict"] == "different functions"
    code, report, err = cli_here(capsys, "check", GPT2, "--revision", OTHER_COMMIT, "--symmetry", "channels",
                                 "--forward-only", "--json")
    assert code == 0, err
    assert json.loads(report)["passed"]


def test_another_head_class_by_name(offline_cache, capsys):
    _, weights = offline_cache
    loaded = registry.load_model(CLASSIFIER, torch.float64)
    assert type(loaded.model).__name__ == "BertForSequenceClassification"
    assert loaded.info.task == "text-classification" and loaded.labels == ["LABEL_0", "LABEL_1"]
    assert torch.equal(loaded.model.classifier.weight.float(), weights[CLASSIFIER_COMMIT]["classifier.weight"])
    code, out, err = cli_here(capsys, "check", CLASSIFIER, "--symmetry", "channels", "--symmetry", "heads",
                              "--forward-only", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert (report["model"], report["family"], report["passed"]) == (CLASSIFIER, "bert", True)


@pytest.mark.parametrize(("argv", "message"), [
    (["check", "someorg/not-cached"], f"someorg/not-cached {ABSENT}"),
    (["check", GPT2, "--revision", "no-such-branch"], f"{GPT2} at revision no-such-branch {ABSENT}"),
    (["check", GPT2, "--revision", "d" * 40], f"{GPT2} at revision {'d' * 40} {ABSENT}"),
    (["check", "random:gpt2", "--revision", "main"], "random:gpt2 is none"),
    (["compare", GPT2, "random:gpt2", "--revision-b", "main"], "random:gpt2 is none"),
    (["scramble", "someorg/not-cached", "--symmetry", "mlp", "--key", "1", "--out", "unused"], ABSENT),
    (["check", "someorg/not-cached", "--stream"], f"someorg/not-cached {ABSENT}"),
])
def test_names_and_revisions_that_do_not_resolve_are_one_line(offline_cache, capsys, argv, message):
    code, out, err = cli_here(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err


def test_the_listed_hub_models_stay_suggestions_that_resolve_alike(offline_cache):
    """The zoo's list still names them (with what they are); unlisted org/names resolve the same way, and a name
    that is neither listed nor org/name is still unknown."""
    assert "gpt2" in hub.HUB_MODELS and hub_checkpoints.is_hub_name("gpt2")
    assert hub_checkpoints.is_hub_name(GPT2) and not hub_checkpoints.is_hub_name("digits-vit")
    assert not hub_checkpoints.is_hub_name("random:gpt2") and not hub_checkpoints.is_hub_name("a--b/c")
    with pytest.raises(ModelLoadError, match=f"gpt2 {ABSENT}.*offline.*digits-vit"):
        registry.load_model("gpt2")
    with pytest.raises(ModelLoadError, match="Unknown model 'no-such-model'"):
        registry.load_model("no-such-model")


# --- online: only config, tokenizer and safetensors ---


class FakeHub:
    """snapshot_download as the Hub answers it for one repository whose files are `remote`: only the files the
    allow_patterns match are copied into the snapshot, and every request is recorded."""

    def __init__(self, remote: Path, cache: Path):
        self.remote, self.cache, self.requests = remote, cache, []

    def __call__(self, repo_id, revision=None, local_files_only=False, allow_patterns=None, cache_dir=None, **_):
        from huggingface_hub.errors import LocalEntryNotFoundError

        self.requests.append((revision, local_files_only, tuple(allow_patterns or ())))
        snapshot = self.cache / "snapshots" / MAIN_COMMIT
        if local_files_only:
            if not snapshot.is_dir():
                raise LocalEntryNotFoundError("not cached")
            return str(snapshot)
        snapshot.mkdir(parents=True, exist_ok=True)
        for path in self.remote.iterdir():
            if any(fnmatch.fnmatch(path.name, pattern) for pattern in allow_patterns or ()):
                shutil.copyfile(path, snapshot / path.name)
        return str(snapshot)


def test_online_only_config_tokenizer_and_the_weights_named_are_downloaded(tmp_path, monkeypatch):
    import huggingface_hub

    remote = tmp_path / "remote"
    weights = saved(remote, "gpt2", 4)
    (remote / "modeling_custom.py").write_text("raise SystemExit('remote code ran')\n")
    torch.save({}, remote / "pytorch_model.bin")
    shutil.copyfile(remote / "model.safetensors", remote / "consolidated.safetensors")  # not what config loads
    fake = FakeHub(remote, tmp_path / "cache")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    monkeypatch.setattr(hub, "hub_offline", lambda: False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    loaded = registry.load_model("someorg/online-gpt2", torch.float32)
    fetched = {p.name for p in (tmp_path / "cache" / "snapshots" / MAIN_COMMIT).iterdir()}
    assert fetched == {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                       "tokenizer_config.json"} | ({"special_tokens_map.json"} & {p.name for p in remote.iterdir()})
    assert [r[1] for r in fake.requests] == [True, False, False]  # the cache first, then metadata, then weights
    assert fake.requests[2] == (MAIN_COMMIT, False, ("model.safetensors",))  # pinned to the commit just read
    assert not any(fnmatch.fnmatch(f, p) for _, _, patterns in fake.requests for p in patterns
                   for f in ("pytorch_model.bin", "modeling_custom.py", "consolidated.safetensors"))
    params = dict(loaded.model.named_parameters())
    assert torch.equal(params["transformer.h.0.ln_1.weight"], weights["transformer.h.0.ln_1.weight"])


def test_online_a_checkpoint_with_only_pickle_weights_is_refused_in_one_line(tmp_path, monkeypatch):
    import huggingface_hub

    remote = tmp_path / "remote"
    saved(remote, "gpt2", 5)
    (remote / "model.safetensors").unlink()
    torch.save({}, remote / "pytorch_model.bin")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", FakeHub(remote, tmp_path / "cache"))
    monkeypatch.setattr(hub, "hub_offline", lambda: False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelLoadError) as caught:
        registry.load_model("someorg/pickled-gpt2")
    message = str(caught.value)
    assert "\n" not in message and "someorg/pickled-gpt2 has no safetensors weights" in message
    assert not (tmp_path / "cache" / "snapshots" / MAIN_COMMIT / "pytorch_model.bin").exists()
