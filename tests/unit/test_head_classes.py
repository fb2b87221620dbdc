"""Every head class transformers has for each supported family is checked, or refused with a one-line reason.

The table comes from transformers' own auto mappings (keyed by model_type), so a head class a new transformers
adds shows up here as a failure until it is supported or refused. Each supported class is built tiny with random
weights, both at Hugging Face's own init (plain from_config) and with norms, biases and positions far from it
(random_models.randomize_): `check` passes on the tokens and channels symmetries (the ones a head's parameters
and outputs take part in: its weights read the residual stream, its outputs may have a token axis), and a
checkpoint `scramble` writes with every weight symmetry, reloaded by plain transformers, gives the same head
outputs as the original. Negative controls: a head rule that forgets the residual axis, a causal sequence
classifier whose pooled last token is moved, question answering's scores without their token axis: each fails.
"""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
import transformers as hf
from transformers.models.auto import modeling_auto

from perm_core.engine.spec import Rule
from perm_core.families import UnsupportedModelError, _registry, family_of, gpt2
from perm_core.models.random_models import build_random_model, random_config, random_inputs
from perm_core.run import trace
from perm_core.run.numerics import use_exact_numerics
from perm_core.verify.check import check
from tests.unit.scrambled_checkpoints import save_and_scramble

pytestmark = pytest.mark.usefixtures("one_thread")

# Every auto mapping that names a head (or the bare model) for one of the supported model types.
MAPPINGS = ("MODEL_MAPPING_NAMES", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
            "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",
            "MODEL_FOR_MASKED_LM_MAPPING_NAMES", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
            "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES",
            "MODEL_FOR_PRETRAINING_MAPPING_NAMES", "MODEL_FOR_NEXT_SENTENCE_PREDICTION_MAPPING_NAMES",
            "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_TEXT_ENCODING_MAPPING_NAMES",
            "MODEL_FOR_MASKED_IMAGE_MODELING_MAPPING_NAMES", "MODEL_FOR_BACKBONE_MAPPING_NAMES",
            "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES")
# Model types beside a family's own whose classes must be refused with a reason: Gemma 3's multimodal model.
RELATED_MODEL_TYPES = {"gemma3": ("gemma3",)}
MOE_FAMILIES = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss"}  # their routers' softmax is float32 too
RMS_NORM_FAMILIES = {"llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3", "t5"} | MOE_FAMILIES  # float32 norms
FLOAT32 = {"BertForQuestionAnswering", "GPT2ForSequenceClassification", "LlamaForQuestionAnswering",
           "RobertaForMultipleChoice", "T5ForTokenClassification", "DeiTForImageClassificationWithTeacher"}


def _mapped_classes() -> dict[str, set[str]]:
    """class name -> the model types it is mapped under (only classes whose own config has that model type)."""
    wanted = {t for family in _registry().values() for t in (*family.model_types,
                                                                 *RELATED_MODEL_TYPES.get(family.name, ()))}
    found: dict[str, set[str]] = {}
    for mapping in MAPPINGS:
        for model_type, names in getattr(modeling_auto, mapping).items():
            if model_type not in wanted:
                continue
            for name in (names,) if isinstance(names, str) else names:
                cls = getattr(hf, name, None)
                if cls is not None and getattr(cls.config_class, "model_type", None) == model_type:
                    found.setdefault(name, set()).add(model_type)
    return found


def table() -> tuple[list[tuple[str, str]], list[tuple[str, str, str]]]:
    """(family, class) supported; (family, class, model_type) refused: every mapped class of every family."""
    mapped = _mapped_classes()
    supported, refused = [], []
    for family in _registry().values():
        own = set(family.model_types)
        related = set(RELATED_MODEL_TYPES.get(family.name, ()))
        for name in sorted(mapped):
            types = mapped[name] & (own | related)
            if not types:
                continue
            if name in family.classes:
                supported.append((family.name, name))
            else:
                refused.append((family.name, name, sorted(types)[0]))
    return supported, refused


SUPPORTED, REFUSED = table()
# The bare models output the residual stream itself, in the scrambled checkpoint's channel order: no head output
# to compare as is (their checks above cover them).
BARE = {name for mapping in ("MODEL_MAPPING_NAMES", "MODEL_FOR_TEXT_ENCODING_MAPPING_NAMES")
        for name in getattr(modeling_auto, mapping).values() if isinstance(name, str)}
WITH_HEADS = [case for case in SUPPORTED if case[1] not in BARE]


def test_the_table_covers_every_family_and_head():
    assert {family for family, _ in SUPPORTED} == set(_registry())
    names = {name for _, name in SUPPORTED}
    for expected in ("GPT2ForSequenceClassification", "LlamaForSequenceClassification", "RobertaForQuestionAnswering",
                     "BertForMultipleChoice", "Gemma3TextForSequenceClassification", "T5ForQuestionAnswering",
                     "DeiTForImageClassificationWithTeacher"):
        assert expected in names
    # Every class a family lists is a class of the installed transformers.
    for family in _registry().values():
        assert all(isinstance(getattr(hf, name, None), type) for name in family.classes), family.name


def build(family: str, name: str, init: str, dtype=torch.float64):
    if init == "far":
        model, _ = build_random_model(family, model_class=name, dtype=dtype, seed=1)
        return model
    torch.manual_seed(0)
    model = getattr(hf, name)(random_config(family)).to(dtype).eval()
    use_exact_numerics(model)
    return model


def failures(report) -> list[str]:
    found = [f"{c.symmetry} {c.direction}: {c.note or f'{c.max_rel_error:.1e}'}" for c in report.checks if not c.passed]
    found += [f"control {c.symmetry}/{c.name} unbroken ({c.max_rel_error:.1e})"
              for c in report.controls if not c.broken]
    found += [f"{n.symmetry} not holding, unproven" for n in report.not_symmetries if not n.broken]
    return found


@pytest.mark.parametrize("init", ["hf", "far"])
@pytest.mark.parametrize(("family", "name"), SUPPORTED, ids=[name for _, name in SUPPORTED])
def test_check_passes_on_every_head_class(family, name, init):
    model = build(family, name, init)
    report = check(model, random_inputs(family, model, seed=1), ["tokens", "channels"], key=3,
                   include_combined=False)
    assert report.passed, failures(report)
    assert report.family == family


@pytest.mark.parametrize(("family", "name"), [case for case in SUPPORTED if case[1] in FLOAT32],
                         ids=[name for _, name in SUPPORTED if name in FLOAT32])
def test_check_passes_in_float32(family, name):
    model = build(family, name, "far", torch.float32)
    report = check(model, random_inputs(family, model, seed=2), ["tokens", "channels"], key=4,
                   include_combined=False)
    assert report.passed, failures(report)


def head_outputs(out) -> dict[str, torch.Tensor]:
    return {field: getattr(out, field) for field in trace.HEAD_OUTPUTS if getattr(out, field, None) is not None}


@pytest.mark.parametrize(("family", "name"), WITH_HEADS, ids=[name for _, name in WITH_HEADS])
def test_scrambled_checkpoint_of_every_head_class_gives_the_same_outputs(tmp_path, family, name):
    model = build(family, name, "far")
    record = save_and_scramble(model, tmp_path)
    assert record["class"] == name

    def plain(directory):  # experts: eager (grouped_mm refuses float64); gpt-oss's sinks have no sdpa
        moe = {"experts_implementation": "eager"} if family in MOE_FAMILIES else {}
        attention = "eager" if family == "gpt_oss" else "sdpa"
        return getattr(hf, name).from_pretrained(directory, dtype=torch.float64, attn_implementation=attention,
                                                 **moe).eval()

    original, scrambled = plain(tmp_path / "original"), plain(tmp_path / "scrambled")
    inputs = {k: v.to(torch.float64) if v.is_floating_point() else v
              for k, v in random_inputs(family, model, seed=1).items()}
    with torch.no_grad():
        want, got = head_outputs(original(**inputs)), head_outputs(scrambled(**inputs))
    assert want and want.keys() == got.keys()
    tolerance = 1e-5 if family in RMS_NORM_FAMILIES else 1e-12
    for field in want:
        error = ((got[field] - want[field]).abs().max() / want[field].abs().max()).item()
        assert error < tolerance, (field, error)
    moved = max(((a - b).abs().max() / a.abs().max()).item()
                for (n, a), b in zip(original.named_parameters(), scrambled.parameters(), strict=True)
                if a.shape == b.shape and a.dim() == 2)
    assert moved > 0.1  # the checkpoint really is scrambled


@pytest.mark.parametrize(("family", "name", "model_type"), REFUSED, ids=[name for _, name, _ in REFUSED])
def test_every_other_class_is_refused_with_a_reason(family, name, model_type):
    # family_of reads only the class name and config.model_type: a stand-in of the class spares building it.
    stand_in = type(name, (), {"config": SimpleNamespace(model_type=model_type)})()
    with pytest.raises(UnsupportedModelError, match=rf"^{name} is not supported: \S") as refused:
        family_of(stand_in)
    assert "\n" not in str(refused.value)


def test_the_cli_refuses_a_refused_class_in_one_line(tmp_path, capsys):
    from perm_core.__main__ import main

    config = hf.ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                          image_size=8, patch_size=4, encoder_stride=4)
    hf.ViTForMaskedImageModeling(config).save_pretrained(tmp_path / "mim")
    # Gemma 3's multimodal model is another model_type than the gemma3 family's: its config alone says which.
    (tmp_path / "gemma3").mkdir()
    (tmp_path / "gemma3" / "config.json").write_text(json.dumps(
        {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"]}))
    (tmp_path / "gemma3" / "model.safetensors").write_bytes(b"")
    capsys.readouterr()
    for directory, reason in (("mim", "masked-image-modeling"), ("gemma3", "multimodal")):
        assert main(["check", str(tmp_path / directory), "--symmetry", "channels"]) == 2
        error = capsys.readouterr().err.strip()
        assert error.startswith("error:") and "\n" not in error and reason in error, error


# --- negative controls: the engine stays strict on heads ---


def test_a_head_rule_that_forgets_the_residual_axis_fails(monkeypatch):
    wrong = tuple(Rule(r.pattern, (None, None), r.tag) if r.pattern == r"score\.weight" else r
                  for r in gpt2.rules(gpt2.geometry(random_config("gpt2"))))
    monkeypatch.setattr(gpt2, "FAMILY", replace(gpt2.FAMILY, rules=lambda g: wrong))
    model = build("gpt2", "GPT2ForSequenceClassification", "far")
    report = check(model, random_inputs("gpt2", model, seed=1), ["channels"], key=3)
    assert not report.passed
    assert not all(c.passed for c in report.checks)


def test_a_causal_classifier_whose_last_token_moves_fails(monkeypatch):
    model = build("llama", "LlamaForSequenceClassification", "far")
    inputs = random_inputs("llama", model, seed=1)
    report = check(model, inputs, ["tokens"], key=3)
    assert report.passed, failures(report)
    assert "last_token_moved" in {c.name for c in report.controls}  # and it broke (the report passed)
    from perm_core.families import llama

    monkeypatch.setattr(llama, "FAMILY", replace(llama.FAMILY, pools_last_token=False))
    report = check(model, inputs, ["tokens"], key=3)
    assert not report.passed
    forward = next(c for c in report.checks if c.direction == "forward")
    assert not forward.passed and forward.max_rel_error > 1e-3


def test_question_answering_scores_without_their_token_axis_fail(monkeypatch):
    model = build("roberta", "RobertaForQuestionAnswering", "far")
    monkeypatch.setattr(trace, "HEAD_OUTPUTS", {**trace.HEAD_OUTPUTS, "start_logits": 99, "end_logits": 99})
    report = check(model, random_inputs("roberta", model, seed=1), ["tokens"], key=3)
    assert not report.passed
    bad = {t.name for c in report.checks for t in c.tensors if not t.passed}
    assert "output.start_logits" in bad
