#!/usr/bin/env python3
"""Benchmark: `hsparity compare` over both paths on the real Qwen3.6-27B layout.

    python3 bench/bench_27b.py [--prompts 2] [--tokens 8] [--keep]

Writes a sparse checkpoint (all-zero weights, ~54 GB logical, no disk blocks)
with the published config and tensor table (fixtures/qwen3.6-27b/) under
target/bench/, runs `hsparity compare --paths causal-lm,vlm` on a few short
prompts under /usr/bin/time -v and prints wall time and peak RSS (goal: peak
RSS < 8 GiB on a 24 GiB machine). Standard library only; not part of CI.
"""

import argparse
import json
import shutil

from common import BIN, ROOT, WORK, build, gib, timed, write_sparse_checkpoint


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--keep", action="store_true", help="keep the sparse checkpoint")
    a = ap.parse_args()
    build()
    fx = ROOT / "fixtures" / "qwen3.6-27b"
    cfg = json.loads((fx / "config.json").read_text())
    table = json.loads((fx / "tensors.json").read_text())
    tensors = [dict(t, dtype=t.get("dtype", table.get("dtype", "BF16"))) for t in table["tensors"]]
    ckpt = WORK / "qwen3.6-27b-sparse"
    if ckpt.exists():
        shutil.rmtree(ckpt)
    total = write_sparse_checkpoint(ckpt, cfg, tensors, 15)
    print(f"sparse checkpoint: {ckpt} ({total / 1e9:.1f} GB logical, {len(tensors)} tensors, 15 shards)")
    vocab = cfg["text_config"]["vocab_size"]
    args = ["compare", ckpt, "--paths", "causal-lm,vlm", "--no-report", "--json", "--quiet"]
    for k in range(a.prompts):
        ids = [(1000 + 7919 * (k * a.tokens + i)) % vocab for i in range(a.tokens)]
        args += ["--prompt-ids", ",".join(map(str, ids))]
    wall, rss, out, rc = timed([BIN, *args])
    rep = json.loads(out)
    rows = [r for p in rep.get("pairs", []) for r in p["hidden_states"]]
    nan_inf = sum(r.get("nan_count", 0) + r.get("inf_count", 0) for r in rows)
    scale = max((r.get("max_ref_abs", 0.0) for r in rows), default=0.0)
    print(f"hsparity compare 27B layout, {a.prompts} x {a.tokens} tokens: exit {rc}, verdict {rep.get('verdict')}")
    print(f"  wall      {wall:.1f} s")
    print(f"  peak RSS  {gib(rss)}  (goal < 8 GiB: {'met' if rss < 8 * 2**30 else 'NOT met'})")
    print(f"  NaN/Inf in hidden states: {nan_inf} (of {len(rows)} rows); largest |activation| {scale}")
    if not a.keep:
        shutil.rmtree(ckpt)


if __name__ == "__main__":
    main()
