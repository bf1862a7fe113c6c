#!/usr/bin/env python3
"""Benchmark: `hsparity drafter` against z-lab's DFlash loop on transformers at long prompts.

    python3 bench/drafter_bench.py [--tokens 2048,4000] [--new 32] [--repeat 3]
                                   [--python .venv/bin/python]

The target is the mid-bf16 checkpoint of parity_bench.py (a random ~264 M-parameter Qwen3.5,
bf16 on disk, 12 layers, max_position_embeddings 4096; written by tools/make_mid_checkpoint.py
under target/bench/ if absent). The drafter is a DFlash drafter shaped for it (2 layers, hidden
1024, 8/2 heads, head_dim 128, intermediate 3072, target_layer_ids [1, 5, 9], block 16, bf16),
randomly initialised by dflash 0.1.0's own `DFlashDraftModel` (seed 0) and saved with
`save_pretrained` under target/bench/mid-dflash/ (once).

Per prompt length T: one prompt of T token ids ((17 + 7919 i) mod (vocab - 1): the mask id
vocab - 1 never appears), written to target/bench/drafter-bench-T.jsonl (and -T-ids.json), then,
each under /usr/bin/time -v, median of --repeat:

  hsparity      `drafter --paths causal-lm --prompts drafter-bench-T.jsonl --max-new-tokens N`:
                one prefill, then DFlash rounds until N + block tokens follow the prompt (the end
                rule of z-lab/dflash's GitHub loop, which `drafter` generates with), then every
                round replayed for its DFlash and DDTree τ (a drafter forward each);
  transformers  `dflash.model.dflash_generate(drafter, target, ids, max_new_tokens=N + block,
                temperature=0)` (bench/drafter_loop.py): the target from AutoModelForCausalLM
                (dtype "auto": bf16), the drafter in bf16; one prefill, then a verify forward and a
                drafter forward per round, the drafter's context K/V cached.

The same tokens are generated on both sides; hsparity's replays (about one more drafter forward
per round) are its own. Random weights accept almost no drafts, so both run about N + block
rounds: the figures measure the cost of a long-context drafter evaluation, not τ (printed for
both; z-lab's loop is not lossless on Gated DeltaNet targets, whose cache crop keeps rejected
tokens in the recurrent state).
Standard library only on this side; the transformers side runs in --python. Not part of CI.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BIN, ROOT, WORK, build, gib, machine, median_run  # noqa: E402

TARGET = WORK / "mid-bf16-qwen3_5"
DRAFTER = WORK / "mid-dflash"

MAKE_DRAFTER = r"""
import sys, torch
from transformers import AutoConfig
from dflash.model import DFlashDraftModel
target, out = sys.argv[1], sys.argv[2]
t = AutoConfig.from_pretrained(target).text_config
cfg = AutoConfig.for_model(
    "qwen3", hidden_size=t.hidden_size, num_hidden_layers=2, num_attention_heads=t.num_attention_heads,
    num_key_value_heads=t.num_key_value_heads, head_dim=t.head_dim, intermediate_size=t.intermediate_size,
    vocab_size=t.vocab_size, max_position_embeddings=t.max_position_embeddings + 64, rms_norm_eps=1e-6,
    rope_parameters={"rope_theta": 10000.0, "rope_type": "default"}, tie_word_embeddings=False,
    layer_types=["full_attention", "full_attention"], architectures=["DFlashDraftModel"])
cfg.num_target_layers = t.num_hidden_layers
cfg.block_size = 16
cfg.dflash_config = {"block_size": 16, "mask_token_id": t.vocab_size - 1, "target_layer_ids": [1, 5, 9]}
torch.manual_seed(0)
m = DFlashDraftModel(cfg).to(torch.bfloat16)
m.save_pretrained(out)
"""


def ensure_checkpoints(py):
    if not (TARGET / "config.json").exists():
        subprocess.run([py, ROOT / "tools" / "make_mid_checkpoint.py", TARGET, "--dtype", "bfloat16"], check=True)
    if not (DRAFTER / "config.json").exists():
        subprocess.run([py, "-c", MAKE_DRAFTER, TARGET, DRAFTER], check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="2048,4000",
                    help="prompt lengths, comma-separated (prompt + new tokens + a block <= 4096, the target's "
                         "max_position_embeddings: hsparity refuses a run past it)")
    ap.add_argument("--new", type=int, default=32,
                    help="N: drafter's --max-new-tokens (both sides then generate N + block tokens)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()
    build()
    ensure_checkpoints(a.python)
    for line in machine(a.python):
        print(line)
    vocab = json.loads((TARGET / "config.json").read_text())["text_config"]["vocab_size"]
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    block = json.loads((DRAFTER / "config.json").read_text())["dflash_config"]["block_size"]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), RAYON_NUM_THREADS=str(threads))
    for t in (int(x) for x in a.tokens.split(",")):
        ids = [(17 + 7919 * i) % (vocab - 1) for i in range(t)]
        ids_file = WORK / f"drafter-bench-{t}-ids.json"
        ids_file.write_text(json.dumps(ids))
        prompts_file = WORK / f"drafter-bench-{t}.jsonl"
        prompts_file.write_text(json.dumps({"input_ids": ids}) + "\n")
        py_cmd = [a.python, ROOT / "bench" / "drafter_loop.py", TARGET, DRAFTER, ids_file,
                  str(a.new + block), str(threads)]
        hs_cmd = [BIN, "drafter", TARGET, "--drafter", DRAFTER, "--paths", "causal-lm", "--prompts",
                  prompts_file, "--max-new-tokens", str(a.new), "--json", "--quiet"]
        load0 = os.getloadavg()[0]
        hw, hr, hout, rc = median_run(hs_cmd, a.repeat, env)
        pw, pr, pout, _ = median_run(py_cmd, a.repeat, env)
        hs_tau = json.loads(hout)["paths"][0]["tau_macro"] if hout.strip() else float("nan")
        py_tau = json.loads(pout.strip().splitlines()[-1])["tau"]
        print(f"[drafter, 1 x {t} tokens, {a.new} + {block} new] {threads} threads, median of {a.repeat}, "
              f"load average {load0:.2f} before / {os.getloadavg()[0]:.2f} after")
        print(f"  transformers + dflash_generate: wall {pw:7.2f} s   peak RSS {gib(pr)}   τ {py_tau:.2f}")
        print(f"  hsparity drafter (exit {rc}):     wall {hw:7.2f} s   peak RSS {gib(hr)}   τ {hs_tau:.2f}")
        print(f"  speed-up {pw / hw:6.2f}x   peak-RSS ratio (hsparity/transformers) {hr / pr:.2f}")


if __name__ == "__main__":
    main()
