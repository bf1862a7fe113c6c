#!/usr/bin/env python3
"""Write the MoE golden corpus: random ``qwen3_5_moe`` checkpoints in the three published expert layouts,
with transformers' own hidden states and router choices on prompts of up to 300 tokens, in bf16 and f32.

    .venv/bin/python tools/moe_corpus.py OUT_DIR [--seeds 7] [--lengths 16,64,160,300]

For each layout (``qwen3.5-fused``, ``qwen3.6-fused``, ``per-expert``: docs/moe.md) and seed, one checkpoint
with weights of its own (``Qwen3_5MoeForConditionalGeneration`` with a micro vision tower, 4 layers: 3 Gated DeltaNet + 1 full
attention, hidden 128; experts / top-k by seed: 8 / 2, 16 / 4, 64 / 8; weights as
``tools/make_moe_fixtures.py`` draws them, stored bf16 with ``text_config.dtype = bfloat16`` as published).
OUT_DIR/{layout}-s{seed}-{bf16|f32}/ holds:

  checkpoint/          the checkpoint (the f32 entry's is a link to the bf16 entry's: the same files)
  prompts.jsonl        one ``{"input_ids": [...]}`` per length, random ids (seeded)
  transformers.safetensors
                       ``AutoModelForCausalLM.from_pretrained(checkpoint, dtype=auto | float32)``, eager
                       attention, the default ``grouped_mm`` experts, on the CPU: hidden states and, per MoE
                       layer, the router's experts and weights (``tools/dump_hidden_states.py``'s writer)

``tools/noise_corpus_check.py OUT_DIR`` then runs ``hsparity dump`` and ``hsparity diff`` on every entry and
states the bitwise rate, the rate inside the noise band and the router agreement (docs/moe.md, "Golden
corpus"). Not committed (about 150 MB); CI reads the MoE fixtures.

Needs transformers 5.23.0, torch 2.15.0, safetensors (tools/requirements.txt).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dump_hidden_states as dhs  # noqa: E402  (tools/ siblings: the dump writer, the fixtures' MoE pieces)
import fixture_configs as fc  # noqa: E402
import make_fixtures as mf  # noqa: E402
import make_moe_fixtures as mmf  # noqa: E402

from transformers import AutoModelForCausalLM, Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration  # noqa: E402

VOCAB = 2048
EXPERTS = [(8, 2), (16, 4), (64, 8)]  # (num_experts, num_experts_per_tok), by seed
DTYPES = {"bf16": "auto", "f32": torch.float32}


def text_config(seed: int) -> dict:
    experts, top_k = EXPERTS[seed % len(EXPERTS)]
    layer_types = fc.hybrid_layer_types(linear_per_full=3, blocks=1)
    return dict(
        vocab_size=VOCAB, hidden_size=128, num_hidden_layers=len(layer_types), layer_types=layer_types,
        **fc.attention_fields(heads=4, kv_heads=2, head_dim=32),
        **fc.gated_deltanet_fields(key_heads=2, value_heads=4, head_dim=32),
        moe_intermediate_size=64, shared_expert_intermediate_size=128,
        num_experts=experts, num_experts_per_tok=top_k, rms_norm_eps=1e-6,
        max_position_embeddings=1024, eos_token_id=0, tie_word_embeddings=False,
        rope_parameters=fc.interleaved_mrope([2, 1, 1], rope_theta=10000000.0))


def write_checkpoint(ckpt: Path, layout: str, seed: int) -> None:
    """Random weights of their own for ``layout`` and ``seed`` (``make_moe_fixtures``' recipe and writer):
    every entry is another model."""
    tc = text_config(seed)
    gen = torch.Generator().manual_seed(7000 + 100 * mmf.LAYOUTS.index(layout) + seed)
    config = Qwen3_5MoeConfig(text_config=dict(tc), vision_config=dict(fc.MICRO_VISION_CONFIG),
                              tie_word_embeddings=False)
    model = Qwen3_5MoeForConditionalGeneration(config).eval().float()
    mmf.randomise_moe(model, gen)
    fused_main = {k: mmf.disk_dtype(k, v) for k, v in model.state_dict().items()}
    mtp = {k: mmf.disk_dtype(k, v) for k, v in mmf.mtp_tensors(gen, tc).items()}
    mmf.write_checkpoint(ckpt, mmf.layout_tensors(fused_main, mtp, layout), mmf.published_like_config(model.config))


def write_entry(out: Path, layout: str, seed: int, dtype: str, lengths: list[int], bf16_entry: Path) -> None:
    ckpt = out / "checkpoint"
    out.mkdir(parents=True, exist_ok=True)
    if dtype == "bf16":
        write_checkpoint(ckpt, layout, seed)
    elif not ckpt.exists():
        os.symlink(os.path.relpath(bf16_entry / "checkpoint", out), ckpt)
    gen = torch.Generator().manual_seed(1000 + seed)
    with open(out / "prompts.jsonl", "w") as f:
        for n in lengths:
            f.write(json.dumps({"input_ids": torch.randint(1, VOCAB, (n,), generator=gen).tolist()}) + "\n")
    model = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=DTYPES[dtype], attn_implementation="eager").eval()
    want = torch.bfloat16 if dtype == "bf16" else torch.float32
    assert next(model.parameters()).dtype == want, next(model.parameters()).dtype
    assert model.config.get_text_config()._experts_implementation == "grouped_mm"
    prompts = dhs.read_prompts(str(out / "prompts.jsonl"), None)
    tensors = dhs.dump(model, prompts, with_logits=False)
    assert any(".router." in k for k in tensors), "the dump holds the router choices"
    save_file(tensors, str(out / "transformers.safetensors"),
              metadata=dhs.metadata(model, "checkpoint", "AutoModelForCausalLM"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--seeds", type=int, default=7)
    ap.add_argument("--lengths", default="16,64,160,300")
    ap.add_argument("--layouts", default=",".join(mmf.LAYOUTS))
    ap.add_argument("--dtypes", default="bf16,f32")
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]
    mf.setup_determinism()
    for layout in a.layouts.split(","):
        for seed in range(a.seeds):
            bf16_entry = a.out / f"{layout}-s{seed}-bf16"
            for dtype in a.dtypes.split(","):
                entry = a.out / f"{layout}-s{seed}-{dtype}"
                write_entry(entry, layout, seed, dtype, lengths, bf16_entry)
                print(f"wrote {entry}", flush=True)


if __name__ == "__main__":
    main()
