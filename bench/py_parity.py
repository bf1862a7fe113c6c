#!/usr/bin/env python3
"""The transformers reference for the hsparity benchmark: what a user would write
instead of `hsparity compare` for the causal-lm vs vlm paths.

    python bench/py_parity.py CKPT --ids-file IDS.json [--threads N] [--dtype float32|auto]
                              [--dump OUT.safetensors]

Loads AutoModelForCausalLM and AutoModel (`--dtype`: float32, or `auto` as a user
loads a checkpoint: each class resolves its own dtype from the config; eager
attention), forwards the same token ids through both with output_hidden_states=True, and compares
every hidden state (cosine min, max |diff|, relative L2). Prints one line per
hidden-state index and, last, `peak_rss_bytes=` (VmHWM) and `wall_s=`.

With `--dump OUT` it is what a user would write instead of `hsparity dump --path
causal-lm`: AutoModelForCausalLM alone, every prompt's hidden states and logits
saved to one safetensors file (`hidden_states.{prompt}.{index}`, `logits.{prompt}`).
"""

import argparse
import json
import os
import time

t_start = time.time()

import torch  # noqa: E402
from transformers import AutoModel, AutoModelForCausalLM  # noqa: E402


def vmhwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return -1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("--ids-file", required=True, help="JSON list of lists of token ids")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--dtype", default="float32", choices=["float32", "auto"])
    ap.add_argument("--dump", help="save causal-lm's hidden states and logits here instead")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    prompts = json.load(open(a.ids_file))
    kw = dict(dtype=torch.float32 if a.dtype == "float32" else "auto", attn_implementation="eager")
    if a.dump:
        dump(a, prompts, kw)
        return
    with torch.inference_mode():
        causal = AutoModelForCausalLM.from_pretrained(a.ckpt, **kw).eval()
        vlm = AutoModel.from_pretrained(a.ckpt, **kw).eval()
        rows = {}
        for ids in prompts:
            x = torch.tensor([ids])
            oa = causal(input_ids=x, output_hidden_states=True)
            ob = vlm(input_ids=x, output_hidden_states=True)
            for i, (ha, hb) in enumerate(zip(oa.hidden_states, ob.hidden_states)):
                ha, hb = ha[0].float(), hb[0].float()
                cos = torch.nn.functional.cosine_similarity(ha, hb, dim=-1).min().item()
                mad = (ha - hb).abs().max().item()
                rel = ((ha - hb).norm() / ha.norm().clamp_min(1e-30)).item()
                r = rows.setdefault(i, [1.0, 0.0, 0.0])
                rows[i] = [min(r[0], cos), max(r[1], mad), max(r[2], rel)]
    for i, (cos, mad, rel) in sorted(rows.items()):
        print(f"hidden_states[{i:>2}]  cos_min {cos:.7f}  max|d| {mad:.3e}  relL2 {rel:.3e}")
    print(f"peak_rss_bytes={vmhwm()}")
    print(f"wall_s={time.time() - t_start:.3f}")


def dump(a, prompts, kw):
    from safetensors.torch import save_file

    out = {}
    with torch.inference_mode():
        causal = AutoModelForCausalLM.from_pretrained(a.ckpt, **kw).eval()
        for k, ids in enumerate(prompts):
            o = causal(input_ids=torch.tensor([ids]), output_hidden_states=True)
            for i, h in enumerate(o.hidden_states):
                out[f"hidden_states.{k}.{i}"] = h[0].contiguous()
            out[f"logits.{k}"] = o.logits[0].contiguous()
    save_file(out, a.dump)
    print(f"peak_rss_bytes={vmhwm()}")
    print(f"wall_s={time.time() - t_start:.3f}")


if __name__ == "__main__":
    main()
