#!/usr/bin/env python3
"""Benchmark: hsparity on the real Qwen3.6-27B layout — `compare` over both
paths, and the drafter evaluation with a drafter shaped like
z-lab/Qwen3.6-27B-DFlash.

    python3 bench/bench_27b.py [--prompts 2] [--tokens 8] [--output 64] [--new 16]
                               [--only compare,a,b,c] [--keep]

Writes a sparse checkpoint (all-zero weights, ~54 GB logical, no disk blocks)
with the published config and tensor table (fixtures/qwen3.6-27b/) under
target/bench/, and a sparse drafter (5 layers, hidden 5120, 32/8 heads,
head_dim 128, intermediate 17408, target_layer_ids [1, 16, 31, 46, 61], four
sliding-window layers (window 2048) and one full, block 16, mask id 248070;
~3.5 GB in bf16) the same way. Then, each under /usr/bin/time -v:

  compare   `compare --paths causal-lm,vlm` on the prompts alone, and again on
            prompt + output tokens (the tokens run (a) feeds);
  (a)       `drafter --trajectories` over prompts x --output tokens;
  (b)       `drafter` generating --new tokens per prompt (the DFlash loop);
  (c)       `triage --trajectories` on the trajectories of (a).

Prints wall time, sweeps and peak RSS of each next to compare's, and the
streamed compare's wall time next to the time to read the shards' bytes once
(`cat` of every shard to /dev/null, timed in the same run: the physical floor of
a streamed run on the disk holding the checkpoint; the sparse shards here read
their holes as zeros, so on this layout the floor is the kernel's copy rate, a
real checkpoint's is its disk's). Goals on a
2-core 24 GiB machine: every run's peak RSS < 8 GiB; (a) within 3x of
compare's wall time on the same tokens; (b) sweeps <= rounds + 1.

All-zero weights make every logit 0, so every argmax is token 0: the supplied
trajectories are token 0 throughout (the greedy output of this model), and
every draft is accepted. The numbers measure cost, not τ. Standard library
only; not part of CI.
"""

import argparse
import json
import os
import shutil

from common import machine, BIN, ROOT, WORK, build, gib, timed, write_sparse_checkpoint

DRAFTER = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "dtype": "bfloat16",
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "num_hidden_layers": 5,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_theta": 10000000.0, "rope_type": "default"},
    "max_position_embeddings": 262144,
    "layer_types": ["sliding_attention"] * 4 + ["full_attention"],
    "sliding_window": 2048,
    "use_sliding_window": True,
    "attention_bias": False,
    "tie_word_embeddings": False,
    "num_target_layers": 64,
    "block_size": 16,
    "dflash_config": {"block_size": 16, "mask_token_id": 248070, "target_layer_ids": [1, 16, 31, 46, 61]},
}


def drafter_tensors(cfg):
    h, i, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    k = len(cfg["dflash_config"]["target_layer_ids"])
    t = [("fc.weight", [h, k * h]), ("hidden_norm.weight", [h])]
    for l in range(cfg["num_hidden_layers"]):
        p = f"layers.{l}."
        t += [
            (p + "input_layernorm.weight", [h]),
            (p + "post_attention_layernorm.weight", [h]),
            (p + "self_attn.q_proj.weight", [q, h]),
            (p + "self_attn.k_proj.weight", [kv, h]),
            (p + "self_attn.v_proj.weight", [kv, h]),
            (p + "self_attn.o_proj.weight", [h, q]),
            (p + "self_attn.q_norm.weight", [hd]),
            (p + "self_attn.k_norm.weight", [hd]),
            (p + "mlp.gate_proj.weight", [i, h]),
            (p + "mlp.up_proj.weight", [i, h]),
            (p + "mlp.down_proj.weight", [h, i]),
        ]
    t.append(("norm.weight", [h]))
    return [{"name": n, "shape": s, "dtype": "BF16"} for n, s in t]


def run(label, args, rows):
    wall, rss, out, rc = timed([BIN, *args])
    rep = json.loads(out)
    rows.append((label, wall, rss, rep, rc))
    return rep


def sweeps_of(rep):
    if rep.get("kind") == "drafter":
        return sum(p["sweeps"] for p in rep["paths"]), max(p["rounds"] for p in rep["paths"])
    if rep.get("kind") == "triage":
        return rep["baseline"]["sweeps"] + sum(v["sweeps"] for v in rep["variants"] if not v.get("shared_sweeps_with")), None
    return None, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=8, help="prompt tokens")
    ap.add_argument("--output", type=int, default=64, help="output tokens of the trajectories (a), (c)")
    ap.add_argument("--new", type=int, default=16, help="new tokens generated in (b)")
    ap.add_argument("--only", default="compare,a,b,c")
    ap.add_argument("--keep", action="store_true", help="keep the sparse checkpoints")
    a = ap.parse_args()
    only = set(a.only.split(","))
    build()
    print("\n".join(machine(None)))
    fx = ROOT / "fixtures" / "qwen3.6-27b"
    cfg = json.loads((fx / "config.json").read_text())
    table = json.loads((fx / "tensors.json").read_text())
    tensors = [dict(t, dtype=t.get("dtype", table.get("dtype", "BF16"))) for t in table["tensors"]]
    ckpt, dr = WORK / "qwen3.6-27b-sparse", WORK / "qwen3.6-27b-dflash-sparse"
    for d in (ckpt, dr):
        if d.exists():
            shutil.rmtree(d)
    total = write_sparse_checkpoint(ckpt, cfg, tensors, 15)
    dtotal = write_sparse_checkpoint(dr, DRAFTER, drafter_tensors(DRAFTER), 1)
    print(f"sparse checkpoint: {ckpt} ({total / 1e9:.1f} GB logical, {len(tensors)} tensors, 15 shards)")
    print(f"sparse drafter:    {dr} ({dtotal / 1e9:.2f} GB logical, z-lab Qwen3.6-27B-DFlash shape)")
    vocab = cfg["text_config"]["vocab_size"]
    prompts = [[(1000 + 7919 * (k * a.tokens + i)) % vocab for i in range(a.tokens)] for k in range(a.prompts)]
    traj = WORK / "qwen3.6-27b-trajectories.jsonl"
    traj.write_text("".join(json.dumps({"prompt_ids": p, "output_ids": [0] * a.output}) + "\n" for p in prompts))
    ids = lambda seqs: [x for s in seqs for x in ("--prompt-ids", ",".join(map(str, s)))]
    q = ["--json", "--quiet"]
    rows = []
    floor = None
    if "compare" in only:
        shards = sorted(ckpt.glob("*.safetensors"))
        floor = timed(["sh", "-c", 'cat "$@" > /dev/null', "cat", *shards])[0]
        run(f"compare, {a.prompts} x {a.tokens} tokens", ["compare", ckpt, "--paths", "causal-lm,vlm", "--no-report", *q, *ids(prompts)], rows)
        full = [p + [0] * a.output for p in prompts]
        run(f"compare, {a.prompts} x {a.tokens + a.output} tokens (= (a)'s)", ["compare", ckpt, "--paths", "causal-lm,vlm", "--no-report", *q, *ids(full)], rows)
    d = ["--drafter", dr]
    if "a" in only:
        run(f"(a) drafter --trajectories {a.prompts} x {a.output}", ["drafter", ckpt, *d, "--trajectories", traj, *q], rows)
    if "b" in only:
        run(f"(b) drafter {a.prompts} x {a.new} new", ["drafter", ckpt, *d, "--max-new-tokens", str(a.new), *q, *ids(prompts)], rows)
    if "c" in only:
        run(f"(c) triage --trajectories {a.prompts} x {a.output}", ["triage", ckpt, *d, "--trajectories", traj, "--no-report", *q], rows)
    print(f"\nmachine: {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f} at the end")
    print(f"{'run':52} {'exit':>4} {'wall':>8} {'peak RSS':>10} {'sweeps':>7} {'rounds':>6}")
    for label, wall, rss, rep, rc in rows:
        s, r = sweeps_of(rep)
        print(f"{label:52} {rc:>4} {wall:>7.1f}s {gib(rss):>10} {s if s is not None else '-':>7} {r if r is not None else '-':>6}")
    if floor is not None:
        for label, wall, _, _, _ in rows:
            if label.startswith("compare"):
                print(f"{label}: {wall:.1f} s vs reading the shards once (cat): {floor:.1f} s "
                      f"({wall / floor:.1f}x the read floor)")
    by = {l.split(" ")[0] + (" full" if "(a)'s" in l else ""): (w, rss, rep) for l, w, rss, rep, _ in rows}
    print()
    if "compare full" in by and "(a)" in by:
        ratio = by["(a)"][0] / by["compare full"][0]
        print(f"(a) / compare on the same tokens: {ratio:.2f}x (goal <= 3x: {'met' if ratio <= 3 else 'NOT met'})")
    if "(b)" in by:
        s, r = sweeps_of(by["(b)"][2])
        paths = by["(b)"][2]["paths"]
        own = [p for p in paths if p["sweeps"] > 0]
        ok = all(p["sweeps"] <= p["rounds"] + 1 for p in own)
        print(f"(b) sweeps per path {[p['sweeps'] for p in own]} vs rounds {[p['rounds'] for p in own]}: goal sweeps <= rounds + 1 {'met' if ok else 'NOT met'}")
    if "(c)" in by:
        rep = by["(c)"][2]
        base = rep["baseline"]
        print(f"(c) per run: baseline {base['wall_s']:.1f} s, {base['sweeps']} sweeps")
        for v in rep["variants"]:
            shared = v.get("shared_sweeps_with") or []
            how = f"shares the sweeps of {', '.join(shared)}" if shared else f"{v['sweeps']} sweeps of its own"
            print(f"    {v['name']:28} {v['wall_s']:8.1f} s  {how}")
        if "(a)" in by:
            ratio = by["(c)"][0] / by["(a)"][0]
            print(f"(c) / (a) on the same tokens: {ratio:.2f}x (goal <= 2x: {'met' if ratio <= 2 else 'NOT met'})")
    worst = max(r[2] for r in rows) if rows else 0
    print(f"largest peak RSS {gib(worst)} (goal < 8 GiB: {'met' if worst < 8 * 2**30 else 'NOT met'})")
    if not a.keep:
        shutil.rmtree(ckpt)
        shutil.rmtree(dr)


if __name__ == "__main__":
    main()
