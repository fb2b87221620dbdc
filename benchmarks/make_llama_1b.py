"""Write a random TinyLlama-1.1B-shaped checkpoint: sharded float32 safetensors (about 4.4 GB) with an index.

Hidden 2048, 22 layers, 16 heads with 4 key/value heads, MLP 5632, vocabulary 32000, untied head: the shape of
TinyLlama-1.1B. Weights are drawn one tensor at a time and written as they are drawn (perm_core.stream.shards), far
from Hugging Face's init as the random zoo models are (norm gains 1 + 0.4 N(0, 1), embeddings N(0, 1), the rest
N(0, 1) x 1.5 / sqrt(hidden)), so the process never holds more than the largest tensor.

    python benchmarks/make_llama_1b.py [DIR]        # default /tmp/tse-llama-1b
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from perm_core.stream.shards import INDEX, ShardWriter  # noqa: E402

SHARD_BYTES = 1 << 30


def config():
    import transformers as hf

    return hf.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                          num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048,
                          rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                          architectures=["LlamaForCausalLM"], dtype="float32")


def drawn(name: str, shape: tuple[int, ...], hidden: int, generator: torch.Generator) -> torch.Tensor:
    noise = torch.randn(shape, generator=generator, dtype=torch.float32)
    if len(shape) == 1:
        return 1.0 + 0.4 * noise
    if "embed" in name:
        return noise
    return noise * (1.5 / math.sqrt(hidden))


def write(out: Path, seed: int = 0) -> int:
    import transformers as hf

    cfg = config()
    with torch.device("meta"):
        model = hf.LlamaForCausalLM(cfg)
    layout = [(name, torch.float32, tuple(p.shape)) for name, p in model.named_parameters()]
    shards, current, size = [], [], 0
    for entry in layout:  # greedy, in parameter order, as save_pretrained cuts shards
        nbytes = math.prod(entry[2]) * 4
        if current and size + nbytes > SHARD_BYTES:
            shards.append(current)
            current, size = [], 0
        current.append(entry)
        size += nbytes
    shards.append(current)
    out.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(out)
    generator = torch.Generator().manual_seed(seed)
    weight_map, total = {}, 0
    for number, shard in enumerate(shards, start=1):
        file = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        writer = ShardWriter(out / file, shard, {"format": "pt"})
        for name, _, shape in shard:
            writer.write(name, drawn(name, shape, cfg.hidden_size, generator))
            weight_map[name] = file
            total += math.prod(shape) * 4
        writer.close()
    (out / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="/tmp/tse-llama-1b")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    started = time.perf_counter()
    total = write(Path(args.out), args.seed)
    print(f"wrote {args.out}: {total / 1e9:.2f} GB of float32 weights in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
