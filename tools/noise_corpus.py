#!/usr/bin/env python3
"""Write the noise-floor corpus: random Qwen3.5 checkpoints (dense and MoE) in bf16 and fp16, with
transformers' own hidden states of each on prompts of 24 to 512 tokens.

    .venv/bin/python tools/noise_corpus.py OUT_DIR [--seeds 3] [--lengths 24,96,256,512]

For each family (``dense``: ``Qwen3_5ForCausalLM``, 6 layers, hidden 256; ``moe``:
``Qwen3_5MoeForCausalLM``, 4 layers, hidden 128, 16 experts top-4; with ``--deep`` 12 layers hidden 512
and 8 layers hidden 256), seed and dtype (``bfloat16``, ``float16``),
OUT_DIR/{family}-s{seed}-{bf16|f16}/ holds:

  checkpoint/     ``save_pretrained`` of a randomly initialised model (transformers' init with seed,
                  norms given a spread N(0, 0.1) so that no layer is an identity on them), in the dtype
  prompts.jsonl   one ``{"input_ids": [...]}`` per length, random ids (seeded)
  transformers.safetensors
                  ``hidden_states`` of ``AutoModelForCausalLM.from_pretrained(checkpoint)`` (dtype auto:
                  the checkpoint's), eager attention, on the CPU, in the dump format of
                  ``tools/dump_hidden_states.py`` (the same writer)

With ``--fixture``, OUT_DIR (``fixtures/noise-floor``) gets two small entries instead (dense: 3 layers,
hidden 64; moe: 4 layers, hidden 128, 16 experts top-4, so that transformers' run flips some router choices; vocab
256; bf16; prompts of 48 and 300 tokens): the
ones ``tests/noise_floor.rs`` reads.

``tools/noise_corpus_check.py`` then runs ``hsparity dump`` and ``hsparity diff`` on every entry and
states how often transformers' difference from hsparity lies inside hsparity's measured noise band
(docs/noise-floor.md). The corpus is not committed (about 150 MB); CI reads the small entries
``--fixture`` writes.

Needs transformers 5.23.0, torch 2.15.0, safetensors (tools/requirements.txt).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import (AutoModelForCausalLM, Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM,
                          Qwen3_5MoeTextConfig, Qwen3_5TextConfig)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dump_hidden_states as dhs  # noqa: E402  (tools/ sibling: the dump writer)
import fixture_configs as fc  # noqa: E402

VOCAB = 2048
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


def dense_config(layers: int = 6, hidden: int = 256, head_dim: int = 64, vocab: int = VOCAB) -> Qwen3_5TextConfig:
    return Qwen3_5TextConfig(**fc.qwen3_5_text_config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden,
        layer_types=fc.hybrid_layer_types(linear_per_full=2, blocks=layers // 3),
        attention=fc.attention_fields(heads=4, kv_heads=2, head_dim=head_dim),
        gated_deltanet=fc.gated_deltanet_fields(key_heads=2, value_heads=4, head_dim=head_dim),
        max_position_embeddings=1024, eos_token_id=0,
        rope_parameters=fc.interleaved_mrope([4, 2, 2], rope_theta=10000000.0)))


def moe_config(layers: int = 4, hidden: int = 128, vocab: int = VOCAB, experts: int = 16,
               inter: int = 64, head_dim: int = 32) -> Qwen3_5MoeTextConfig:
    return Qwen3_5MoeTextConfig(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
        layer_types=fc.hybrid_layer_types(linear_per_full=3, blocks=layers // 4),
        **fc.attention_fields(heads=4, kv_heads=2, head_dim=head_dim),
        **fc.gated_deltanet_fields(key_heads=2, value_heads=4, head_dim=head_dim),
        moe_intermediate_size=inter, shared_expert_intermediate_size=2 * inter,
        num_experts=experts, num_experts_per_tok=experts // 4, rms_norm_eps=1e-6,
        max_position_embeddings=1024, eos_token_id=0, tie_word_embeddings=False,
        rope_parameters=fc.interleaved_mrope([2, 1, 1], rope_theta=10000000.0))


# The fixture CI reads (``--fixture``): the same families, small enough to commit.
FIXTURE_CONFIGS = {
    "dense": lambda: dense_config(layers=3, hidden=64, head_dim=16, vocab=256),
    "moe": lambda: moe_config(layers=4, hidden=128, vocab=256, experts=16, inter=16, head_dim=32),
}
CORPUS_CONFIGS = {"dense": dense_config, "moe": moe_config}
# ``--deep``: the same families twice as deep and wide.
DEEP_CONFIGS = {
    "dense": lambda: dense_config(layers=12, hidden=512, head_dim=128),
    "moe": lambda: moe_config(layers=8, hidden=256),
}


def make_model(family: str, seed: int, configs: dict = CORPUS_CONFIGS) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = configs[family]()
    model = (Qwen3_5ForCausalLM(config) if family == "dense" else Qwen3_5MoeForCausalLM(config)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(0.0, 0.1)
    return model


def write_entry(out: Path, family: str, seed: int, dtype: str, lengths: list[int],
                configs: dict = CORPUS_CONFIGS) -> None:
    ckpt = out / "checkpoint"
    model = make_model(family, seed, configs)
    vocab = model.config.vocab_size
    model.to(DTYPES[dtype]).save_pretrained(str(ckpt))
    gen = torch.Generator().manual_seed(1000 + seed)
    with open(out / "prompts.jsonl", "w") as f:
        for n in lengths:
            ids = torch.randint(1, vocab, (n,), generator=gen).tolist()
            f.write(json.dumps({"input_ids": ids}) + "\n")
    model = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype="auto", attn_implementation="eager").eval()
    assert next(model.parameters()).dtype == DTYPES[dtype], next(model.parameters()).dtype
    prompts = dhs.read_prompts(str(out / "prompts.jsonl"), None)
    meta = dhs.metadata(model, "checkpoint", "AutoModelForCausalLM")
    save_file(dhs.dump(model, prompts, with_logits=False), str(out / "transformers.safetensors"), metadata=meta)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--lengths", default="24,96,256,512")
    ap.add_argument("--families", default="dense,moe")
    ap.add_argument("--dtypes", default="bf16,f16")
    ap.add_argument("--deep", action="store_true",
                    help="dense 12 layers hidden 512, moe 8 layers hidden 256 (instead of 6 x 256 and 4 x 128)")
    ap.add_argument("--fixture", action="store_true",
                    help="write the small entries CI reads (fixtures/noise-floor/: dense and moe in bf16, seed 0, "
                         "prompts of 48 and 300 tokens) instead of the corpus")
    a = ap.parse_args()
    if a.fixture:
        for family in ("dense", "moe"):
            entry = a.out / f"{family}-s0-bf16"
            write_entry(entry, family, 0, "bf16", [48, 300], FIXTURE_CONFIGS)
            print(f"wrote {entry}", flush=True)
        return
    lengths = [int(x) for x in a.lengths.split(",")]
    torch.set_num_threads(max(1, torch.get_num_threads()))
    for family in a.families.split(","):
        for seed in range(a.seeds):
            for dtype in a.dtypes.split(","):
                entry = a.out / f"{family}-s{seed}-{dtype}"
                write_entry(entry, family, seed, dtype, lengths, DEEP_CONFIGS if a.deep else CORPUS_CONFIGS)
                print(f"wrote {entry}", flush=True)


if __name__ == "__main__":
    main()
