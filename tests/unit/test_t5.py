"""T5, an encoder-decoder: which symmetries hold, in which form, why tokens do not, and planted bugs.

random:t5 has 2 encoder and 2 decoder blocks (layers 0-1 and 2-3), 4 heads of 8 channels, gated GELU, an
LM head tied to the embedding (transformers always ties T5's), randomized RMSNorm gains and a relative position
bias of std 3 (block 0 of each stack, shared by that stack's layers). The decoder reads 7 tokens, the
encoder 12 (the last one padding).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import transformers as hf

from perm_core.__main__ import main
from perm_core.engine import symmetries
from perm_core.engine.spec import FamilySpec, Rule, UnclaimedParameterError
from perm_core.engine.tokens import model_inputs
from perm_core.families import family_of, t5
from perm_core.models import registry
from perm_core.models.defaults import default_inputs
from perm_core.models.random_models import random_config, random_inputs, randomize_
from perm_core.run.numerics import use_exact_numerics
from perm_core.verify.check import check, check_scramble
from perm_core.verify.controls import measure_break
from perm_core.verify.subject import Subject
from perm_core.verify.tolerances import BROKEN_AT
from tests.unit.json_schema import validated
from tests.unit.scrambled_checkpoints import save_and_scramble

pytestmark = pytest.mark.usefixtures("one_thread")
EXACT = 1e-9  # float64
BIAS = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"


@pytest.fixture(scope="module")
def tiny():
    loaded = registry.load_model("random:t5", dtype=torch.float64)
    return loaded.model, default_inputs(loaded)


def variant(model_class: str, feed_forward: str, tied: bool, dtype=torch.float64):
    """random:t5's shape with another head, feed-forward or embedding tying (T5 v1.0: relu, tied). The
    config always says tied (tie_word_embeddings=False only drops the output scale): untie it after."""
    fields = {k: v for k, v in random_config("t5").to_dict().items()
              if k in ("vocab_size", "d_model", "d_kv", "num_heads", "num_layers", "num_decoder_layers", "d_ff",
                       "relative_attention_num_buckets", "relative_attention_max_distance", "pad_token_id",
                       "eos_token_id", "decoder_start_token_id")}
    config = hf.T5Config(**fields, feed_forward_proj=feed_forward, tie_word_embeddings=tied, dropout_rate=0.0)
    config.tie_word_embeddings = tied
    torch.manual_seed(2)
    model = randomize_(getattr(hf, model_class)(config).to(dtype), 2)
    use_exact_numerics(model)
    return model.eval()


def assert_exact_report(report, bound=EXACT):
    failing = [(c.symmetry, c.direction, c.max_rel_error, c.note) for c in report.checks if not c.passed]
    assert not failing
    assert max(c.max_rel_error for c in report.checks) <= bound
    assert min(c.moved for c in report.checks) >= 0.1
    assert all(c.broken for c in report.controls), [(c.name, c.max_rel_error) for c in report.controls]
    assert report.passed


def test_tiny_model_exercises_what_t5_adds(tiny):
    model, inputs = tiny
    g = family_of(model).geometry(model.config)
    assert (g.n_layers, g.n_decoder_layers, g.n_heads, g.head_dim, g.d_mlp) == (4, 2, 4, 8, 64)
    assert g.shared_head_bias and g.relative_position_bias and g.input_kind == "seq2seq-text"
    assert [list(s) for s in g.stacks()] == [[0, 1], [2, 3]]
    assert (inputs["input_ids"].shape[1], inputs["decoder_input_ids"].shape[1]) == (12, 7)
    params = dict(model.named_parameters())
    assert params[BIAS].std() > 2  # a loud position bias
    assert not model.config.scale_decoder_outputs and set(params) & {"lm_head.weight", "encoder.embed_tokens.weight"} \
        == set()  # tied: shared.weight is the only embedding
    assert {"encoder.block.0.layer.1.DenseReluDense.wi_0.weight",
            "decoder.block.1.layer.2.DenseReluDense.wi_1.weight"} <= set(params)
    for name, p in params.items():
        if name.endswith("layer_norm.weight"):
            assert p.std() > 0.1, name  # far from the uniform gain of HF's init
    claims = Subject(model, inputs).claims
    layer_of = {name: claim.layer for name, claim in claims.items()}
    assert layer_of["encoder.block.1.layer.0.SelfAttention.q.weight"] == 1
    assert layer_of["decoder.block.1.layer.0.SelfAttention.q.weight"] == 3
    assert layer_of["decoder.block.1.layer.1.EncDecAttention.k.weight"] == 3
    assert layer_of[BIAS] == 0 and layer_of[BIAS.replace("encoder", "decoder")] == 2
    assert claims[BIAS].rule.axes == (None, "heads")


def test_heads_are_drawn_once_per_stack(tiny):
    g = family_of(tiny[0]).geometry(tiny[0].config)
    element = symmetries.build("heads", 11, g)
    order = {layer: element.spaces[("heads", layer)][0].index.tolist() for layer in range(4)}
    assert order[0] == order[1] and order[2] == order[3]
    assert "heads" in g.restrictions() and "bias" in g.restrictions()["heads"]
    assert symmetries.key_space_bits("heads", g) == pytest.approx(2 * math.log2(math.factorial(4) - 1))


@pytest.mark.parametrize("key", [0, 3])
def test_check_passes_on_random_t5_float64_and_tokens_is_measured_not_checked(tiny, key):
    model, inputs = tiny
    report = check(model, inputs, key=key, model_name="random:t5")
    assert report.family == "t5"
    assert_exact_report(report)
    checked = {c.symmetry for c in report.checks}
    assert checked == {"channels", "heads", "head_channels", "mlp", "rotation", "all"}
    assert {c.direction for c in report.checks} == {"forward", "backward"}
    assert {"heads_differ_per_layer", "keys_moved_wrongly", "qk_across_heads", "norms_not_permuted",
            "residual_rotation", "keys_not_permuted", "output_not_permuted", "keys_rotated_differently"} \
        <= {c.name for c in report.controls}
    [tokens] = report.not_symmetries
    assert tokens.symmetry == "tokens" and tokens.max_rel_error > 1e-2 and "position bias" in tokens.reason
    assert set(report.restricted) == {"heads"}
    payload = report.to_json()
    assert payload["not_symmetries"][0]["symmetry"] == "tokens" and payload["not_symmetries"][0]["broken"]


def test_check_passes_on_random_t5_float32():
    loaded = registry.load_model("random:t5", dtype=torch.float32)
    report = check(loaded.model, default_inputs(loaded), key=2)
    assert_exact_report(report, bound=1e-3)
    assert report.not_symmetries[0].max_rel_error > 1e-2


@pytest.mark.parametrize(("model_class", "feed_forward", "tied"), [
    ("T5ForConditionalGeneration", "relu", True), ("T5Model", "gated-gelu", False), ("T5EncoderModel", "relu", True)])
def test_other_heads_and_feed_forwards(model_class, feed_forward, tied):
    model = variant(model_class, feed_forward, tied)
    names = {name for name, _ in model.named_parameters()}
    assert ("lm_head.weight" in names) == (model_class == "T5ForConditionalGeneration" and not tied)
    assert ("encoder.embed_tokens.weight" in names) == (not tied)
    report = check(model, random_inputs("t5", model, seed=1), key=4, include_combined=False)
    assert_exact_report(report)
    assert [n.symmetry for n in report.not_symmetries] == ["tokens"] and report.not_symmetries[0].broken
    if model_class == "T5EncoderModel":
        assert family_of(model).geometry(model.config).stacks() == [range(2)]


def test_cross_attention_records_unscramble(tiny):
    model, inputs = tiny
    subject = Subject(model, inputs)
    original = subject.trace()
    element = subject.build({"heads": 6, "channels": 6})
    scrambled = subject.trace(element)
    restored = subject.unscramble(scrambled, element)
    for layer in (2, 3):
        name = f"blocks.{layer}.cross_attn"
        assert original[name].tensor.shape == (1, 4, 7, 12)
        assert original[name].axes == (None, ("heads", layer), None, "tokens")
        before = original[name].tensor
        assert (scrambled[name].tensor - before).abs().max() / before.abs().max() > 0.1
        assert (restored[name] - before).abs().max() / before.abs().max() <= EXACT
    assert original["blocks.2.attn"].tensor.shape == (1, 4, 7, 7)  # decoder self-attention
    assert original["blocks.1.attn"].tensor.shape == (1, 4, 12, 12)  # encoder self-attention


def test_tokens_move_only_the_encoder_input_and_break_only_by_the_position_bias(tiny):
    model, inputs = tiny
    subject = Subject(model, inputs)
    element = subject.build({"tokens": 1})
    kwargs = model_inputs(inputs, subject.geometry, element, torch.float64)
    order = element.tokens.index
    assert set(kwargs) == {"input_ids", "attention_mask", "decoder_input_ids"}  # no position ids: T5 takes none
    assert torch.equal(kwargs["input_ids"], inputs["input_ids"][:, order])
    assert torch.equal(kwargs["attention_mask"], inputs["attention_mask"][:, order])
    assert torch.equal(kwargs["decoder_input_ids"], inputs["decoder_input_ids"])
    assert measure_break(subject, element, subject.trace()) > 1e-2
    without_bias = copy.deepcopy(model)
    with torch.no_grad():
        dict(without_bias.named_parameters())[BIAS].zero_()
    bias_free = Subject(without_bias, inputs)
    assert measure_break(bias_free, element, bias_free.trace()) <= EXACT  # the bias is the only cause


def _with_rules(subject: Subject, rules) -> Subject:
    subject.spec = FamilySpec("t5-with-bug", tuple(rules))
    subject.claims = subject.spec.claim_all(subject.params)
    return subject


def test_planted_bug_decoder_numbered_like_the_encoder_fails(tiny):
    model, inputs = tiny
    subject = Subject(model, inputs)
    original = subject.trace()
    honest = subject.build({"heads": 9})
    assert all(r.passed for r in check_scramble(subject, honest, "heads", original, backward=False))
    g = subject.geometry
    buggy_rules = (Rule(r"shared\.weight", (None, "resid"), "embedding"), *t5._stack_rules("encoder", 0),
                   *t5._stack_rules("decoder", 0), Rule(r"lm_head\.weight", (None, "resid"), "head"))
    _with_rules(subject, buggy_rules)
    assert subject.claims["decoder.block.1.layer.0.SelfAttention.q.weight"].layer == 1  # same key as the encoder's
    assert g.n_layers == 4
    [forward] = check_scramble(subject, honest, "heads", original, backward=False)
    assert not forward.passed and forward.max_rel_error > BROKEN_AT


def test_planted_bug_position_bias_left_in_place_fails(tiny):
    model, inputs = tiny
    subject = Subject(model, inputs)
    original = subject.trace(backward=True)
    bug = Rule(r".*relative_attention_bias\.weight", (None, None), "bug")  # claimed first: never moves
    _with_rules(subject, (bug, *subject.spec.rules))
    assert subject.claims[BIAS].rule.tag == "bug"
    results = check_scramble(subject, subject.build({"heads": 9}), "heads", original, backward=True)
    assert not any(r.passed for r in results)
    assert max(r.max_rel_error for r in results) > BROKEN_AT


def test_scrambled_checkpoint_reloaded_by_plain_transformers_gives_the_same_logits(tiny, tmp_path):
    model, inputs = tiny
    assert save_and_scramble(model, tmp_path)["family"] == "t5"

    def plain(directory):
        return hf.T5ForConditionalGeneration.from_pretrained(directory, dtype=torch.float64,
                                                             attn_implementation="eager").eval()

    original, scrambled = plain(tmp_path / "original"), plain(tmp_path / "scrambled")
    with torch.no_grad():
        want, got = original(**inputs).logits, scrambled(**inputs).logits
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-5  # stock T5LayerNorm: variance in float32
    moved = max(((a - b).abs().max() / a.abs().max()).item()
                for (name, a), b in zip(original.named_parameters(), scrambled.parameters(), strict=True)
                if "norm" not in name)
    assert moved > 0.1
    with torch.no_grad():  # negative control: the shared position bias left in its original head order
        dict(scrambled.named_parameters())[BIAS].copy_(dict(original.named_parameters())[BIAS])
        broken = scrambled(**inputs).logits
    assert ((broken - want).abs().max() / want.abs().max()).item() > BROKEN_AT


def test_cli_check_random_t5_reports_tokens_as_not_holding(capsys):
    assert main(["check", "random:t5", "--dtype", "float64", "--json"]) == 0
    payload = validated("check", capsys.readouterr().out)
    assert payload["passed"] and payload["family"] == "t5"
    assert [n["symmetry"] for n in payload["not_symmetries"]] == ["tokens"]
    assert payload["not_symmetries"][0]["max_rel_error"] > 1e-2
    assert "tokens" not in {c["symmetry"] for c in payload["checks"]}


def test_zoo_lists_and_loads_random_t5():
    loaded = registry.load_model("random:t5", dtype=torch.float64)
    assert loaded.info.family == "t5" and loaded.info.task == "seq2seq" and loaded.image_size is None
    assert "random:t5" in registry.offline_model_names()


def test_t5_heads_are_claimed_whole():
    """T5's classification, token-classification and question-answering heads (tests/unit/test_head_classes.py
    checks them); a parameter no rule names is still refused."""
    config = hf.T5Config(**{**random_config("t5").to_dict(), "num_labels": 3})
    for cls in (hf.T5ForQuestionAnswering, hf.T5ForSequenceClassification, hf.T5ForTokenClassification):
        model = cls(config)
        assert family_of(model).spec(model.config).unclaimed(dict(model.named_parameters())) == [], cls
    with pytest.raises(UnclaimedParameterError, match="qa_extra"):
        family_of(model).spec(model.config).claim_all(["qa_extra.weight"])


def test_text_alone_is_read_by_the_decoder_in_its_original_order(tiny):
    """The sidebar gives ids and a mask only: the decoder then reads the same text, never moved."""
    model, _ = tiny
    text_only = {"input_ids": torch.arange(3, 12)[None], "attention_mask": torch.ones(1, 9, dtype=torch.long)}
    subject = Subject(model, text_only)
    element = subject.build({"tokens": 2})
    kwargs = model_inputs(text_only, subject.geometry, element, torch.float64)
    assert torch.equal(kwargs["decoder_input_ids"], text_only["input_ids"])
    assert not torch.equal(kwargs["input_ids"], text_only["input_ids"])
    report = check(model, text_only, ["tokens", "heads", "mlp"], key=2)
    assert_exact_report(report)
    assert report.not_symmetries[0].max_rel_error > 1e-2


def test_gradients_of_both_stacks_and_every_parameter(tiny):
    model, inputs = tiny
    subject = Subject(model, inputs)
    records = subject.trace(backward=True)
    assert records["grad.input"].axes == (None, "tokens", "resid")  # d loss / d the encoder's embedding output
    assert records["grad.input"].tensor.shape == (1, 12, 32)
    assert records["grad.decoder.embed"].tensor.shape == (1, 7, 32)
    assert records["grad.blocks.3.hidden"].axes == (None, None, "resid")  # decoder tokens never move
    assert {f"grad.param.{name}" for name in subject.params} <= set(records)
    assert records[f"grad.param.{BIAS}"].tensor.abs().max() > 0


def test_explore_says_why_t5_fails_with_tokens_on_and_passes_without(tiny):
    """The Explore verdict with the sidebar's default symmetries (tokens among them) fails on T5, as it must, and
    names the missing symmetry and the reason; without tokens the same model passes and nothing is blamed."""
    from perm_core.explore.exploration import Exploration

    model, inputs = tiny
    explorer = Exploration(model, inputs)
    with_tokens = explorer.run({"tokens": 7, "channels": 42})
    assert not with_tokens.passed and with_tokens.worst_rel > BROKEN_AT
    assert with_tokens.expected_failure and list(with_tokens.not_holding) == ["tokens"]
    verdict = with_tokens.verdict()
    assert "NOT identical" in verdict and "tokens is not a symmetry of this model" in verdict
    assert "relative position bias" in verdict and f"{with_tokens.worst_rel:.1e}" in verdict

    without = explorer.run({"channels": 42, "heads": 3})
    assert without.passed and without.worst_rel <= EXACT
    assert not without.expected_failure and without.not_holding == {}
    assert "not a symmetry" not in without.verdict()

    from perm_core.explore.exploration import control_options

    name = next(c for c in control_options(explorer.subject, {"tokens": 7}) if c.startswith("channels/"))
    control = explorer.run({"tokens": 7}, control=name)  # a control's verdict is about the control
    assert not control.expected_failure and "not a symmetry" not in control.verdict()


def test_a_model_with_every_symmetry_blames_none():
    from perm_core.explore.exploration import Exploration

    loaded = registry.load_model("random:gpt2", dtype=torch.float64)
    result = Exploration(loaded.model, default_inputs(loaded)).run({"tokens": 7, "channels": 42})
    assert result.passed and result.not_holding == {} and not result.expected_failure
