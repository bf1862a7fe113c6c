#!/usr/bin/env python3
"""Where torch's bf16 arithmetic on this CPU parts from hsparity's: two measurements behind
docs/moe.md section 8 and docs/performance.md ("bf16 products on AMX").

    .venv/bin/python tools/bf16_order_census.py gemm
    .venv/bin/python tools/bf16_order_census.py router CORPUS_DIR     # tools/moe_corpus.py's entries

``gemm``: for five shapes (M tokens, N outputs, K inputs), ``torch.nn.functional.linear`` on random
bf16 inputs against ten candidate orders of the same f32 sums, each rounded to bf16 at the end:
sequential over k in pairs (even then odd, odd then even), exact blocks of 2 to 64 terms added in
f32, and f32-rounded blocks of 16 and 32. Prints, per shape, how many outputs each order gets
wrong: an order that matched torch would show 0 on every shape.

``router``: on each bf16 corpus entry, transformers' forward with a hook on every
``Qwen3_5MoeTopKRouter``: the router's logits against the same input's gate product rounded once
(an f64 sum, then f32, then bf16), and the top-k those logits choose against the router's. Prints
the running totals: logits compared and differing, choices compared and differing -- how far the
router's own product order decides its choices.

Needs transformers 5.23.0 and torch 2.15.0 (tools/requirements.txt).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

SHAPES = [(16, 256, 256), (64, 512, 512), (128, 384, 1024), (300, 256, 128), (256, 1024, 2048)]


def bf16_of(x32: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(x32, dtype=np.float32)).to(torch.bfloat16).float().numpy()


def candidate_orders(a: np.ndarray, w: np.ndarray) -> dict[str, np.ndarray]:
    """The f32 sums of a @ w.T in each candidate order, rounded to bf16."""
    m, k = a.shape
    out = {}
    for name, order in (("pairs even-odd", (0, 1)), ("pairs odd-even", (1, 0))):
        acc = np.zeros((m, w.shape[0]), np.float32)
        for i in range(0, k, 2):
            for j in order:
                acc = (acc + np.outer(a[:, i + j], w[:, i + j])).astype(np.float32)
        out[name] = bf16_of(acc)
    a64, w64 = a.astype(np.float64), w.astype(np.float64)
    for block in (2, 4, 8, 16, 32, 64):
        acc = np.zeros((m, w.shape[0]), np.float32)
        for i in range(0, k, block):
            acc = (acc.astype(np.float64) + a64[:, i:i + block] @ w64[:, i:i + block].T).astype(np.float32)
        out[f"exact blocks of {block}"] = bf16_of(acc)
    for block in (16, 32):
        acc = np.zeros((m, w.shape[0]), np.float32)
        for i in range(0, k, block):
            acc = acc + (a64[:, i:i + block] @ w64[:, i:i + block].T).astype(np.float32)
        out[f"f32 blocks of {block}"] = bf16_of(acc)
    return out


def gemm() -> None:
    torch.manual_seed(0)
    for m, n, k in SHAPES:
        x = torch.randn(m, k).bfloat16()
        w = (torch.randn(n, k) / k ** 0.5).bfloat16()
        ref = torch.nn.functional.linear(x, w).float().numpy()
        orders = candidate_orders(x.float().numpy(), w.float().numpy())
        cells = ", ".join(f"{name} {int((v != ref).sum())}" for name, v in orders.items())
        print(f"M {m} N {n} K {k} ({m * n} outputs): {cells}", flush=True)


def router(corpus: Path) -> None:
    from transformers import AutoModelForCausalLM
    tot = {"logits": 0, "logits_differing": 0, "choices": 0, "choices_differing": 0}
    for entry in sorted(corpus.glob("*-bf16")):
        model = AutoModelForCausalLM.from_pretrained(str(entry / "checkpoint"), dtype="auto",
                                                     attn_implementation="eager").eval()
        seen = []

        def hook(mod, args, out):
            x = args[0].reshape(-1, args[0].shape[-1])
            logits, _scores, indices = out
            once = (x.double() @ mod.weight.double().T).float().to(torch.bfloat16)
            _, again = torch.topk(torch.softmax(once, dtype=torch.float, dim=-1), mod.top_k, dim=-1)
            seen.append((logits, once, indices, again))

        for layer in model.model.layers:
            layer.mlp.gate.register_forward_hook(hook)
        for line in open(entry / "prompts.jsonl"):
            with torch.no_grad():
                model(input_ids=torch.tensor(json.loads(line)["input_ids"])[None], use_cache=False)
        for logits, once, indices, again in seen:
            tot["logits"] += logits.numel()
            tot["logits_differing"] += int((logits != once).sum())
            tot["choices"] += indices.numel()
            tot["choices_differing"] += int((indices != again).sum())
        print(entry.name, tot, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["gemm", "router"])
    ap.add_argument("corpus", type=Path, nargs="?")
    a = ap.parse_args()
    if a.what == "gemm":
        gemm()
    elif a.corpus is None:
        sys.exit("router: give the corpus directory (tools/moe_corpus.py OUT_DIR)")
    else:
        router(a.corpus)


if __name__ == "__main__":
    main()
