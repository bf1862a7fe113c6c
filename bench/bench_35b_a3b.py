#!/usr/bin/env python3
"""Benchmark: `hsparity inventory` and a streamed `hsparity compare` on the Qwen3.5-35B-A3B layout.

    python3 bench/bench_35b_a3b.py [--layout qwen3.5-fused|qwen3.6-fused|per-expert] [--prompts 2] [--tokens 8] [--keep]

Writes a sparse checkpoint (~72 GB logical, no disk blocks for almost all of it) with the published config
and tensor list (fixtures/qwen3.5-35b-a3b/; the other layouts derived by the rules
fixtures/qwen3.5-35b-a3b/expected_counts.json states) under target/bench/. Every weight is zero except
each layer's router (`mlp.gate.weight`, Gaussian) and the embedding rows of the prompt tokens, so the
hidden states are the (normalised) embeddings and the routers pick many different experts: the run widens
the experts real tokens would (all-zero routers would tie and send every token to the same eight). Runs
`inventory` and `compare --paths causal-lm,vlm` under /usr/bin/time -v and prints wall time, peak RSS
(goal: < 8 GiB on a 24 GiB machine) and the experts routed to. Standard library only; not part of CI.
"""

import argparse
import json
import random
import shutil
import struct

from common import machine, BIN, ROOT, WORK, build, gib, read_headers, timed, write_sparse_checkpoint


def bf16_bytes(values):
    """float values -> little-endian bf16 bytes (round to nearest even)."""
    out = bytearray()
    for v in values:
        b = struct.unpack("<I", struct.pack("<f", v))[0]
        b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
        out += struct.pack("<H", b)
    return bytes(out)


def derive(tensors, layout):
    """The published list, or one of the derived layouts (tests/common/moe.rs, the same rules)."""
    if layout == "qwen3.5-fused":
        return tensors
    out = []
    if layout == "qwen3.6-fused":
        per = [t for t in tensors if t["name"].startswith("mtp.") and ".mlp.experts." in t["name"]
               and t["name"].split(".")[-3].isdigit()]
        g0 = next(t for t in per if t["name"].endswith("experts.0.gate_proj.weight"))
        e, (i, h) = len(per) // 3, g0["shape"]
        base = g0["name"][: -len("0.gate_proj.weight")]
        for t in tensors:
            if t in per:
                if t is g0:
                    out.append(dict(t, name=base + "gate_up_proj", shape=[e, 2 * i, h]))
                    out.append(dict(t, name=base + "down_proj", shape=[e, h, i]))
                continue
            out.append(t)
        return out
    for t in tensors:
        n, main = t["name"], t["name"].startswith("model.language_model.")
        if main and n.endswith("mlp.experts.gate_up_proj"):
            e, i2, h = t["shape"]
            for x in range(e):
                out.append(dict(t, name=f"{n[:-len('gate_up_proj')]}{x}.gate_proj.weight", shape=[i2 // 2, h]))
                out.append(dict(t, name=f"{n[:-len('gate_up_proj')]}{x}.up_proj.weight", shape=[i2 // 2, h]))
        elif main and n.endswith("mlp.experts.down_proj"):
            e, h, i = t["shape"]
            for x in range(e):
                out.append(dict(t, name=f"{n[:-len('down_proj')]}{x}.down_proj.weight", shape=[h, i]))
        else:
            out.append(t)
    return out


def offsets(ckpt):
    """name -> (shard file, absolute data offset) from the written headers."""
    return {name: (f, 8 + n + e["data_offsets"][0])
            for f, n, header in read_headers(ckpt) for name, e in header.items()}


def write_values(ckpt, tensors, token_ids, seed=0):
    """Gaussian routers (each layer's rows rotated, so layers route differently) and embedding rows."""
    rng = random.Random(seed)
    where = offsets(ckpt)
    shapes = {t["name"]: t["shape"] for t in tensors}
    routers = sorted(n for n in shapes if n.endswith("mlp.gate.weight") and n.startswith("model.language_model."))
    e, h = shapes[routers[0]]
    block = bf16_bytes(rng.gauss(0.0, 1.0) for _ in range(e * h))
    row = 2 * h
    for li, name in enumerate(routers):
        f, off = where[name]
        shift = (li * 37 % e) * row
        with open(f, "r+b") as fh:
            fh.seek(off)
            fh.write(block[shift:] + block[:shift])
    emb = "model.language_model.embed_tokens.weight"
    f, off = where[emb]
    with open(f, "r+b") as fh:
        for tok in sorted(set(token_ids)):
            fh.seek(off + tok * row)
            fh.write(bf16_bytes(rng.gauss(0.0, 1.0) for _ in range(h)))
    return len(routers)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layout", default="qwen3.5-fused", choices=["qwen3.5-fused", "qwen3.6-fused", "per-expert"])
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--keep", action="store_true", help="keep the sparse checkpoint")
    a = ap.parse_args()
    build()
    print("\n".join(machine(None)))
    fx = ROOT / "fixtures" / "qwen3.5-35b-a3b"
    cfg = json.loads((fx / "config.json").read_text())
    tensors = derive(json.loads((fx / "tensors.json").read_text())["tensors"], a.layout)
    ckpt = WORK / f"qwen3.5-35b-a3b-{a.layout}-sparse"
    if ckpt.exists():
        shutil.rmtree(ckpt)
    total = write_sparse_checkpoint(ckpt, cfg, tensors, 14)
    tc = cfg["text_config"]
    vocab = tc["vocab_size"]
    prompts = [[(1000 + 7919 * (k * a.tokens + i)) % vocab for i in range(a.tokens)] for k in range(a.prompts)]
    layers = write_values(ckpt, tensors, [t for p in prompts for t in p])
    print(f"sparse checkpoint: {ckpt} ({total / 1e9:.1f} GB logical, {len(tensors)} tensors, 14 shards, "
          f"{layers} Gaussian routers + {len({t for p in prompts for t in p})} embedding rows written)")

    wall, rss, out, rc = timed([BIN, "inventory", ckpt, "--json"])
    inv = json.loads(out)
    counts = ", ".join(f"{p['name']} {p['tensors']} tensors ({p['consumed']} consumed, converted "
                       f"{p['converted']['checkpoint_keys']} -> {p['converted']['parameters']}, "
                       f"{p['dropped_by_rule']} dropped)" for p in inv["paths"])
    print(f"hsparity inventory 35B-A3B {a.layout}: exit {rc}, {inv['checkpoint_tensors']} tensors; {counts}")
    print(f"  wall      {wall:.2f} s")
    print(f"  peak RSS  {gib(rss)}")

    args = ["compare", ckpt, "--paths", "causal-lm,vlm", "--no-report", "--json", "--quiet"]
    for p in prompts:
        args += ["--prompt-ids", ",".join(map(str, p))]
    wall, rss, out, rc = timed([BIN, *args])
    rep = json.loads(out)
    rows = [r for p in rep.get("pairs", []) for r in p["hidden_states"]]
    nan_inf = sum(r.get("nan_count", 0) + r.get("inf_count", 0) for r in rows)
    routed = [r["router"] for r in rows if "router" in r]
    flips = sum(r["slots_differing"] for r in routed)
    print(f"hsparity compare 35B-A3B {a.layout}, {a.prompts} x {a.tokens} tokens: exit {rc}, verdict "
          f"{rep.get('verdict')}; {len(routed)} MoE layers, {flips} router flips between the paths")
    print(f"  wall      {wall:.1f} s")
    print(f"  peak RSS  {gib(rss)}  (goal < 8 GiB: {'met' if rss < 8 * 2**30 else 'NOT met'})")
    print(f"  NaN/Inf in hidden states: {nan_inf} (of {len(rows)} rows)")
    for n in rep.get("notes", []):
        print(f"  note: {n}")
    if not a.keep:
        shutil.rmtree(ckpt)


if __name__ == "__main__":
    main()
