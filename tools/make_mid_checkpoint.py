#!/usr/bin/env python3
"""Write a mid-size random Qwen3.5 VLM checkpoint for the performance benchmark.

    .venv/bin/python tools/make_mid_checkpoint.py OUT_DIR [--dtype float32|bfloat16|float16]
        [--text-dtype bfloat16]

About 264 M parameters: hidden 1024, 12 decoder layers (9 Gated DeltaNet + 3 gated
full attention), intermediate 3072, vocab 32000 (untied LM head), a one-block vision
tower. Random weights from transformers' own initialisation (seeded), saved with
``save_pretrained`` in 2 GB shards. ``--text-dtype D`` deletes the top-level ``dtype`` of
config.json and sets ``text_config.dtype = D`` (with ``--dtype float16``: the layout of
``fixtures/divergence/fp16-disk``, where transformers loads AutoModelForCausalLM in bf16 and
AutoModel in fp16). The output is NOT committed (bench/ writes it
under target/bench/). Needs transformers 5.23.0 + torch (tools/requirements.txt).
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fixture_configs as fc  # noqa: E402  (tools/ sibling: config pieces shared with the fixture generators)

LAYER_TYPES = fc.hybrid_layer_types(linear_per_full=3, blocks=3)

TEXT_CONFIG = fc.qwen3_5_text_config(
    vocab_size=32000,
    hidden_size=1024,
    intermediate_size=3072,
    layer_types=LAYER_TYPES,
    attention=fc.attention_fields(heads=8, kv_heads=2, head_dim=128),
    gated_deltanet=fc.gated_deltanet_fields(key_heads=8, value_heads=16, head_dim=128),
    max_position_embeddings=4096,
    eos_token_id=0,
    rope_parameters=fc.interleaved_mrope([11, 11, 10], rope_theta=10000000.0),
)
VISION_CONFIG = fc.qwen3_5_vision_config(
    depth=1,
    hidden_size=64,
    intermediate_size=128,
    num_heads=2,
    patch_size=16,
    spatial_merge_size=2,
    out_hidden_size=1024,
    num_position_embeddings=64,
)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--text-dtype", choices=["float32", "bfloat16", "float16"],
                    help="drop the top-level config dtype, set text_config.dtype to this")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-positions", type=int, default=4096,
                    help="text_config.max_position_embeddings (the longest prompt hsparity accepts)")
    a = ap.parse_args()
    t0 = time.time()
    torch.manual_seed(a.seed)
    config = Qwen3_5Config(
        text_config=dict(TEXT_CONFIG, max_position_embeddings=a.max_positions), vision_config=dict(VISION_CONFIG), tie_word_embeddings=False
    )
    model = Qwen3_5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        # Zero-init norms would make every layer an identity on the norm scale; give
        # them some spread so parity is tested on non-trivial values.
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") and "visual" not in name:
                p.normal_(0.0, 0.1)
    model = model.to(getattr(torch, a.dtype))
    n = sum(p.numel() for p in model.parameters())
    text = sum(p.numel() for k, p in model.named_parameters() if "visual" not in k)
    a.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(a.out), max_shard_size="2GB")
    if a.text_dtype:
        cfg_path = a.out / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg.pop("dtype", None)
        cfg["text_config"]["dtype"] = a.text_dtype
        cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    print(f"wrote {a.out}: {n / 1e6:.1f} M parameters ({text / 1e6:.1f} M text), {a.dtype}, {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
