"""random:FAMILY models whose norms, biases and position values are far from Hugging Face's init.

HF's init (LayerNorm weight 1, bias 0, position embeddings std 0.02, tiny Q/K) makes a forgotten
norm or an unmoved position nearly invisible; these weights make every such bug loud.
"""

from __future__ import annotations

import torch
import transformers as hf

from perm_core.families import family_by_name
from perm_core.run.numerics import use_exact_numerics

RANDOM_SIZES = ("tiny", "base")
TINY_VOCAB = 120
DECODER_TOKENS = 7  # encoder-decoders (T5): the decoder input's length, unlike the encoder's 12

_MOE = dict(vocab_size=TINY_VOCAB, hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=3,
            max_position_embeddings=64, num_experts_per_tok=2, tie_word_embeddings=False, bos_token_id=0,
            eos_token_id=0, pad_token_id=None)
CONFIGS = {
    ("vit", "tiny"): lambda: hf.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                          intermediate_size=64, image_size=16, patch_size=4, num_channels=3,
                                          num_labels=5),
    ("vit", "base"): lambda: hf.ViTConfig(num_labels=1000),  # ViT-B/16-224
    ("bert", "tiny"): lambda: hf.BertConfig(vocab_size=TINY_VOCAB, hidden_size=32, num_hidden_layers=2,
                                            num_attention_heads=4, intermediate_size=64,
                                            max_position_embeddings=64),
    ("bert", "base"): lambda: hf.BertConfig(),  # bert-base-uncased
    ("gpt2", "tiny"): lambda: hf.GPT2Config(vocab_size=TINY_VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                            bos_token_id=0, eos_token_id=0),
    ("gpt2", "base"): lambda: hf.GPT2Config(),  # GPT-2 small
    # Three key/value groups of two query heads, and q/k/v/o and MLP biases, so that a bug leaving a
    # group or a bias behind is loud (SmolLM2 has neither biases nor more than one group per test key).
    ("llama", "tiny"): lambda: hf.LlamaConfig(vocab_size=TINY_VOCAB, hidden_size=48, num_hidden_layers=2,
                                              num_attention_heads=6, num_key_value_heads=3, intermediate_size=64,
                                              max_position_embeddings=64, tie_word_embeddings=False,
                                              attention_bias=True, mlp_bias=True,
                                              bos_token_id=0, eos_token_id=0, pad_token_id=None),
    ("llama", "base"): lambda: hf.LlamaConfig(vocab_size=49152, hidden_size=576, num_hidden_layers=30,
                                              num_attention_heads=9, num_key_value_heads=3,
                                              intermediate_size=1536, max_position_embeddings=8192,
                                              tie_word_embeddings=True, rope_theta=100000.0),  # SmolLM2-135M shape
    # Two key/value groups of two query heads (so groups really move), a sliding window of 4 that a
    # 12-token input exceeds, sliding and global layers with their two RoPE bases.
    ("gemma3", "tiny"): lambda: hf.Gemma3TextConfig(
        vocab_size=TINY_VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, intermediate_size=64, max_position_embeddings=64, sliding_window=4, query_pre_attn_scalar=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], bos_token_id=0, eos_token_id=0,
        pad_token_id=None),
    ("gemma3", "base"): lambda: hf.Gemma3TextConfig(  # gemma-3-270m's shape
        vocab_size=262144, hidden_size=640, num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1,
        head_dim=256, intermediate_size=2048, max_position_embeddings=32768, sliding_window=512,
        query_pre_attn_scalar=256, layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3),
    ("dinov2", "tiny"): lambda: hf.Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                mlp_ratio=2, image_size=16, patch_size=4, num_channels=3,
                                                layerscale_value=0.5),  # lambda1 re-drawn per channel below
    ("dinov2", "base"): lambda: hf.Dinov2Config(hidden_size=384, num_attention_heads=6),  # dinov2-s's shape, 224
    # Two encoder and two decoder blocks, gated GELU and no d_model^-0.5 before the LM head, as T5 v1.1 (whose
    # tie_word_embeddings=False transformers reads as just that: it ties the head all the same); 8 buckets over
    # 12 encoder tokens, so near tokens each get their own bias and far ones share logarithmic buckets.
    ("t5", "tiny"): lambda: hf.T5Config(
        vocab_size=TINY_VOCAB, d_model=32, d_kv=8, num_heads=4, num_layers=2, num_decoder_layers=2, d_ff=64,
        feed_forward_proj="gated-gelu", relative_attention_num_buckets=8, relative_attention_max_distance=16,
        dropout_rate=0.0, tie_word_embeddings=False, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1),
    ("t5", "base"): lambda: hf.T5Config(dropout_rate=0.0),  # t5-small's shape (relu, tied embeddings)
    # GPT-NeoX (Pythia): head_dim 12 with rotary_pct 0.5 (3 rotary planes, 6 channels RoPE leaves alone),
    # parallel residual, biases everywhere, untied output head. Phi-3: two key/value groups of two query
    # heads, partial_rotary_factor 0.5 on head_dim 12, a window of 4 on every layer that a 12-token input exceeds
    # (no base size: Phi-3-mini's 3.8B is too big to build here).
    ("gpt_neox", "tiny"): lambda: hf.GPTNeoXConfig(
        vocab_size=TINY_VOCAB, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, rotary_pct=0.5, use_parallel_residual=True, attention_bias=True,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=0),
    ("gpt_neox", "base"): lambda: hf.GPTNeoXConfig(  # pythia-160m's shape
        vocab_size=50304, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        max_position_embeddings=2048, rotary_pct=0.25),
    ("phi3", "tiny"): lambda: hf.Phi3Config(
        vocab_size=TINY_VOCAB, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=64, original_max_position_embeddings=64,
        partial_rotary_factor=0.5, sliding_window=4, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
        pad_token_id=None),
    # Mistral, Qwen2, Qwen3: three key/value groups of two query heads like random:llama. Mistral's window of 4
    # covers every layer; Qwen2's (switched on here, off in most checkpoints) only the layers from
    # max_window_layers on. Qwen3's heads are 12 wide, so the heads do not add up to the residual width.
    ("mistral", "tiny"): lambda: hf.MistralConfig(
        vocab_size=TINY_VOCAB, hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=3,
        intermediate_size=64, max_position_embeddings=64, sliding_window=4, tie_word_embeddings=False,
        bos_token_id=0, eos_token_id=0, pad_token_id=None),
    ("qwen2", "tiny"): lambda: hf.Qwen2Config(
        vocab_size=TINY_VOCAB, hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=3,
        intermediate_size=64, max_position_embeddings=64, use_sliding_window=True, sliding_window=4,
        max_window_layers=1, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=None),
    ("qwen2", "base"): lambda: hf.Qwen2Config(  # Qwen2.5-0.5B's shape
        vocab_size=151936, hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        intermediate_size=4864, max_position_embeddings=32768, tie_word_embeddings=True, rope_theta=1000000.0),
    ("qwen3", "tiny"): lambda: hf.Qwen3Config(
        vocab_size=TINY_VOCAB, hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=3,
        head_dim=12, intermediate_size=64, max_position_embeddings=64, attention_bias=True,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=None),
    ("qwen3", "base"): lambda: hf.Qwen3Config(  # Qwen3-0.6B's shape
        vocab_size=151936, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
        head_dim=128, intermediate_size=3072, max_position_embeddings=40960, tie_word_embeddings=True,
        rope_theta=1000000.0),
    ("distilbert", "tiny"): lambda: hf.DistilBertConfig(vocab_size=TINY_VOCAB, dim=32, n_layers=2, n_heads=4,
                                                        hidden_dim=64, max_position_embeddings=64),
    ("distilbert", "base"): lambda: hf.DistilBertConfig(),  # distilbert-base-uncased
    # One token type, position ids from padding_idx + 1 = 2 on, like roberta-base.
    ("roberta", "tiny"): lambda: hf.RobertaConfig(vocab_size=TINY_VOCAB, hidden_size=32, num_hidden_layers=2,
                                                  num_attention_heads=4, intermediate_size=64,
                                                  max_position_embeddings=66, type_vocab_size=1, pad_token_id=1),
    ("roberta", "base"): lambda: hf.RobertaConfig(vocab_size=50265, max_position_embeddings=514,
                                                  type_vocab_size=1, pad_token_id=1),  # roberta-base
    ("deit", "tiny"): lambda: hf.DeiTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                            intermediate_size=64, image_size=16, patch_size=4, num_channels=3,
                                            num_labels=5),
    ("deit", "base"): lambda: hf.DeiTConfig(hidden_size=384, num_attention_heads=6, intermediate_size=1536,
                                            num_labels=1000),  # deit-small-distilled-patch16-224's shape
    # Mixtures of experts: four experts of 16 neurons, two chosen per token, three key/value groups of two query
    # heads (no base sizes: the real ones are billions of parameters). Qwen2-MoE's shared expert is 24 wide; Qwen3-MoE's
    # heads are 12 wide; gpt-oss's 8 wide, with a window of 4 on its sliding layers that a 12-token input exceeds.
    ("mixtral", "tiny"): lambda: hf.MixtralConfig(**_MOE, intermediate_size=16, num_local_experts=4),
    ("qwen2_moe", "tiny"): lambda: hf.Qwen2MoeConfig(**_MOE, moe_intermediate_size=16, num_experts=4,
                                                     shared_expert_intermediate_size=24, qkv_bias=True),
    ("qwen3_moe", "tiny"): lambda: hf.Qwen3MoeConfig(**_MOE, head_dim=12, moe_intermediate_size=16, num_experts=4,
                                                     attention_bias=True),
    ("olmoe", "tiny"): lambda: hf.OlmoeConfig(**_MOE, intermediate_size=16, num_experts=4),
    ("gpt_oss", "tiny"): lambda: hf.GptOssConfig(
        **_MOE, head_dim=8, intermediate_size=16, num_local_experts=4, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 1e4}),  # no YaRN at 64 positions
}
DEFAULT_CLASSES = {"vit": "ViTForImageClassification", "bert": "BertForMaskedLM", "gpt2": "GPT2LMHeadModel",
                   "llama": "LlamaForCausalLM", "gemma3": "Gemma3ForCausalLM", "dinov2": "Dinov2Model",
                   "gpt_neox": "GPTNeoXForCausalLM", "phi3": "Phi3ForCausalLM",
                   "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                   "distilbert": "DistilBertForMaskedLM", "roberta": "RobertaForMaskedLM",
                   "deit": "DeiTForImageClassificationWithTeacher",
                   "t5": "T5ForConditionalGeneration", "mixtral": "MixtralForCausalLM",
                   "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "olmoe": "OlmoeForCausalLM",
                   "gpt_oss": "GptOssForCausalLM"}
IMAGE_FAMILIES = ("vit", "dinov2", "deit")


def random_config(family: str, size: str = "tiny"):
    if (family, size) not in CONFIGS:
        raise ValueError(f"no random model {family}-{size}; families: {', '.join(DEFAULT_CLASSES)}; "
                         f"sizes: {', '.join(RANDOM_SIZES)}")
    config = CONFIGS[family, size]()
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    return config


def randomize_(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    d_model = model.config.hidden_size
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float64)
            if param.dim() == 1:
                is_scale = name.endswith("weight")  # LayerNorm / RMSNorm gains
                value = 1.0 + 0.4 * noise if is_scale else 0.3 * noise
            elif name.endswith("_bias"):  # gpt-oss's expert biases [experts, width]
                value = 0.3 * noise
            elif name == "shared.weight" or "relative_attention_bias" in name:  # T5's embedding; a position
                value = noise * (3.0 if "bias" in name else 1.0)  # bias that moved tokens visibly feel
            elif any(part in name for part in ("embed", "wte", "wpe", "cls_token", "distillation_token")):
                value = noise
            else:
                value = noise * 1.5 / d_model**0.5
            param.copy_(value.to(param.dtype))
    return model


def build_random_model(family: str, size: str = "tiny", seed: int = 0, model_class: str | None = None,
                       dtype: torch.dtype = torch.float32):
    """A small (or real-size) random model of a family and no tokenizer: (model, None)."""
    config = random_config(family, size)
    cls = getattr(hf, model_class or DEFAULT_CLASSES[family])
    torch.manual_seed(seed)
    model = cls(config).to(dtype)
    randomize_(model, seed)
    use_exact_numerics(model)
    return model.eval(), None


CHOICES = 3  # a multiple-choice head's inputs: [1, CHOICES, tokens]


def random_inputs(family: str, model, seed: int = 0, n_tokens: int = 12) -> dict:
    """Inputs for a random model: an image batch, or ids with a padded last position ([1, CHOICES, tokens] for a
    multiple-choice head)."""
    generator = torch.Generator().manual_seed(seed)
    config = model.config
    head = type(model).__name__
    if family in IMAGE_FAMILIES:
        shape = (1, config.num_channels, config.image_size, config.image_size)
        return {"pixel_values": torch.randn(shape, generator=generator)}
    shape = (1, CHOICES, n_tokens) if head.endswith("ForMultipleChoice") else (1, n_tokens)
    ids = torch.randint(0, config.vocab_size, shape, generator=generator)
    mask = torch.ones_like(ids)
    mask[..., -1] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    if family == "bert":
        inputs["token_type_ids"] = torch.randint(0, 2, shape, generator=generator)
    if family == "t5" and head == "T5ForSequenceClassification":
        # It reads the decoder's state at the last <eos> of input_ids, so its decoder runs on the input's own
        # length (transformers shifts the input right; perm_core passes the input itself): one <eos>, last.
        ids[ids == config.eos_token_id] = config.eos_token_id + 1
        ids[..., -1] = config.eos_token_id
    elif family == "t5" and config.is_encoder_decoder:  # the decoder's own sequence, of another length
        inputs["decoder_input_ids"] = torch.randint(0, config.vocab_size, (1, DECODER_TOKENS), generator=generator)
    if family == "roberta":  # as a tokenizer pads: the pad id only where the mask is 0
        pad = config.pad_token_id
        ids[ids == pad] = pad + 1
        ids[..., -1] = pad
    pad = getattr(config, "pad_token_id", None)
    if head.endswith("ForSequenceClassification") and pad is not None and family_by_name(family).pools_last_token:
        ids[..., -1] = (pad + 1) % config.vocab_size  # a causal classifier pools the last token that is no pad
    return inputs
