#!/usr/bin/env python3
"""Write a function-equivalent copy of a toy checkpoint whose head dims vLLM's CPU kernels take.

    python tools/engines/vllm_cpu/pad_heads.py IN_DIR OUT_DIR [--attn-head-dim N] [--eps-divisor 4]

vLLM 0.32's CPU build refuses the toy pairs' head dims (16):
- CPU attention takes head sizes 32, 64, 80, ..., 256, 512
  (vllm/v1/attention/backends/cpu_attn.py, CPUAttentionBackend.get_supported_head_sizes);
- the CPU Gated DeltaNet kernels (vllm/model_executor/layers/mamba/ops/cpu/gdn_attention.py,
  cpu_gdn_attention_core -> ops.chunk_gated_delta_rule_cpu / fused_sigmoid_gating_delta_rule_update_cpu)
  take key/value head dims 64 or 128, and bf16 only.

The copy keeps hidden_size, every residual-stream state and every logit to f32 round-off plus
one epsilon effect named below. Every weight of the copy is a weight of the original, placed
elsewhere, or one divided by 2 (exact in bf16), so the copy is stored in the original dtype with
no rounding.

Every padded head's q, k (and GDN output) has a mean square exactly 4x smaller than the
original's, so the per-head RMSNorms are exact only with eps/4. But a model has one epsilon:
transformers and vLLM read config.rms_norm_eps for the hidden-size norms, q_norm/k_norm and
the GDN gated norm alike (vllm/model_executor/layers/mamba/gdn/base.py,
GatedDeltaNetAttention.__init__: layer_norm_epsilon = config.rms_norm_eps). So:
- with Gated DeltaNet layers (qwen3_5) rms_norm_eps is divided by 4 (--eps-divisor 4, forced):
  the GDN gated norm sees a tiny mean square and moves a lot with eps, so it must be exact;
  the hidden-size norms (input/post-attention layernorm, final norm) then see eps/4 instead of
  eps, a relative change of about eps*(3/4)/(2*mean(x^2)) in their output;
- without them (dense qwen3, DFlash drafters) rms_norm_eps is kept: the hidden-size norms are
  exact and the per-head q_norm/k_norm see eps 4x too large for their (larger) mean square.
`hsparity dump --dtype f32` + `hsparity diff` measure what is left (README.md).

Constructions (original head dim D = 16):

Gated DeltaNet (qwen3_5 linear_attention layers), key dim K -> 4K = 64, value dim V -> 4V = 64:
- q and k heads zero-padded: [x, 0, 0, 0]. The l2 norm of the padded head is the original's
  (same sum of squares, same eps), so every l2-normed q, k, every q.k, the delta rule and the
  recurrent state are unchanged; only the kernel's query scale K'^-1/2 is half of K^-1/2, so
  the core output is exactly o/2.
- v heads, z heads and the gated-norm weight replicated 4 times: the core output per value
  head is [o/2, o/2, o/2, o/2], whose mean square is ms(o)/4, so the gated RMSNorm with eps/4
  gives [o_hat]*4 exactly as the original; out_proj reads only the first copy ([W, 0, 0, 0]).
- conv1d channels follow in_proj_qkv (depthwise, no bias; silu(0) = 0 on the zero channels).
- A_log, dt_bias, in_proj_a, in_proj_b unchanged (the number of heads is unchanged).

Attention with (1 + w) q_norm/k_norm (qwen3_5 gated attention), head dim D -> 16D = 256:
- q = [q, q, q, q, 0...], k = [k, 0, 0, 0, k, k, k, 0...] (blocks of D): each has mean square
  ms/4, so q_norm/k_norm with eps/4 give 2*q_hat and 2*k_hat in the first block without any
  weight change, and q'.k' = 4 q_hat.k_hat (the copies never overlap), scaled by 256^-1/2 =
  (16^-1/2)/4: the scores are the original's. v, the output gate and o_proj's columns are
  zero-padded ([x, 0...]); rotary stays on the first rot_dim dims (partial_rotary_factor
  rescaled so int(head_dim * factor) is unchanged, which keeps inv_freq bit-identical).
- With full rotary (dense qwen3 with --attn-head-dim 256) original rotary pair j (dims j, j+D/2)
  goes to pair 16j (dims 16j, 16j+128), whose frequency theta^(-32j/256) is the original's
  theta^(-2j/16) bit for bit; q's copies sit in pairs 16j+1..16j+3, k's in 16j+4..16j+6.

Attention with plain-w q_norm/k_norm (qwen3, DFlash drafter), head dim D -> 4D = 64:
- q, k, v zero-padded with rotary pair j at pair 4j (dims 4j, 4j+32); q_norm/k_norm with eps/4
  give 2*q_hat, 2*k_hat, so k_norm's weight is halved and the scores 2*q_hat.k_hat/8 equal
  q_hat.k_hat/4; o_proj's columns zero-padded.

DFlash needs the drafter's attention KV spec to differ from the target's (else vLLM puts the
drafter's layers in the target's KV-cache groups and asserts), so the default pads targets'
attention to 256 (copies) and drafters' to 64 (zero pad).
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file


def _text_config(cfg: dict) -> dict:
    return cfg.get("text_config", cfg)


def _kind(cfg: dict) -> str:
    arch = (cfg.get("architectures") or [""])[0]
    if arch == "DFlashDraftModel":
        return "dflash"
    mt = cfg.get("model_type", "")
    if mt in ("qwen3_5", "qwen3_5_text"):
        return "qwen3_5"
    if mt == "qwen3":
        return "qwen3"
    raise SystemExit(f"unsupported checkpoint: architectures={cfg.get('architectures')} model_type={mt}")


def rotary_dim_of(tc: dict, head_dim: int) -> int:
    rp = tc.get("rope_parameters") or {}
    return int(head_dim * rp.get("partial_rotary_factor", tc.get("partial_rotary_factor", 1.0)))


def attention_maps(D: int, Dn: int, rot: int, copies: bool) -> tuple[list, list, list]:
    """(q map, k map, v map): lists of (src dim, dst dim) placing one head of D dims in Dn dims.

    The first D pairs of q's and k's maps are the primary placement (kept by rotary); with
    copies, q's map adds 3 copies and k's 3 copies on dims the other never uses."""
    s = Dn // D
    if rot == D:  # full rotary: pair j (j, j + D/2) -> pair s*j (s*j, s*j + Dn/2)
        h, hn = D // 2, Dn // 2

        def at(d: int, slot: int) -> int:
            return (s * d + slot) if d < h else (s * (d - h) + slot + hn)

        primary = [(d, at(d, 0)) for d in range(D)]
        qc = [(d, at(d, c)) for c in (1, 2, 3) for d in range(D)] if copies else []
        kc = [(d, at(d, c)) for c in (4, 5, 6) for d in range(D)] if copies else []
        if copies and s < 7:
            raise SystemExit(f"full-rotary copies need head dim >= 7x{D}")
    else:  # partial rotary: the first rot dims rotate and stay in place, the rest pass through
        primary = [(d, d) for d in range(D)]
        qc = [(d, c * D + d) for c in (1, 2, 3) for d in range(D)] if copies else []
        kc = [(d, c * D + d) for c in (4, 5, 6) for d in range(D)] if copies else []
        if copies and 7 * D > Dn:
            raise SystemExit(f"partial-rotary copies need head dim >= 7x{D}")
    return primary + qc, primary + kc, primary


def place_rows(w: torch.Tensor, heads: int, D: int, Dn: int, mapping, scale: float = 1.0) -> torch.Tensor:
    """Rows [heads*D, ...] -> [heads*Dn, ...]; row (h, src) copied to (h, dst) for each pair."""
    out = torch.zeros((heads * Dn,) + tuple(w.shape[1:]), dtype=w.dtype)
    for h in range(heads):
        for src, dst in mapping:
            out[h * Dn + dst] = w[h * D + src] * scale if scale != 1.0 else w[h * D + src]
    return out


def place_vec(w: torch.Tensor, D: int, Dn: int, mapping, scale: float = 1.0) -> torch.Tensor:
    out = torch.zeros(Dn, dtype=w.dtype)
    for src, dst in mapping:
        out[dst] = w[src] * scale if scale != 1.0 else w[src]
    return out


def place_cols(w: torch.Tensor, heads: int, D: int, Dn: int, mapping) -> torch.Tensor:
    out = torch.zeros((w.shape[0], heads * Dn), dtype=w.dtype)
    for h in range(heads):
        for src, dst in mapping:
            out[:, h * Dn + dst] = w[:, h * D + src]
    return out


def pad_attention(t: dict, pre: str, tc: dict, Dn: int, one_plus_w: bool, gated: bool) -> dict:
    D = tc["head_dim"]
    nh, nkv = tc["num_attention_heads"], tc["num_key_value_heads"]
    rot = rotary_dim_of(tc, D)
    s = Dn // D
    if Dn % D or s not in (4, 16) or (one_plus_w and s != 16):
        raise SystemExit(f"{pre}: padded head dim must be 16x{D} (copies)" + ("" if one_plus_w else f" or 4x{D} (zero pad)"))
    copies = s == 16
    qm, km, vm = attention_maps(D, Dn, rot, copies)
    # Either way q' and k' have a quarter of the original mean square, so the per-head norms
    # give 2*q_hat and 2*k_hat (exactly with eps/4). Copies: q'.k' = 4 q_hat.k_hat against a
    # head-dim scale 16x smaller in square: exact. Zero pad: 4 q_hat.k_hat against a scale 4x
    # smaller in square leaves a factor 2, taken out of k_norm's plain weight (exact in bf16).
    k_scale = 1.0 if copies else 0.5
    out = {}
    q = t[pre + "q_proj.weight"]
    if gated:  # per head [q (D), gate (D)] -> [q' (Dn), gate' (Dn)]
        q2 = q.view(nh, 2, D, -1)
        qq = place_rows(q2[:, 0].reshape(nh * D, -1), nh, D, Dn, qm)
        gg = place_rows(q2[:, 1].reshape(nh * D, -1), nh, D, Dn, vm)
        out[pre + "q_proj.weight"] = torch.stack([qq.view(nh, Dn, -1), gg.view(nh, Dn, -1)], 1).reshape(nh * 2 * Dn, -1)
    else:
        out[pre + "q_proj.weight"] = place_rows(q, nh, D, Dn, qm)
    out[pre + "k_proj.weight"] = place_rows(t[pre + "k_proj.weight"], nkv, D, Dn, km)
    out[pre + "v_proj.weight"] = place_rows(t[pre + "v_proj.weight"], nkv, D, Dn, vm)
    out[pre + "o_proj.weight"] = place_cols(t[pre + "o_proj.weight"], nh, D, Dn, vm)
    out[pre + "q_norm.weight"] = place_vec(t[pre + "q_norm.weight"], D, Dn, qm)
    out[pre + "k_norm.weight"] = place_vec(t[pre + "k_norm.weight"], D, Dn, km, k_scale)
    for b in ("q_proj.bias", "k_proj.bias", "v_proj.bias", "o_proj.bias"):
        if pre + b in t:
            raise SystemExit(f"{pre}{b}: attention bias not supported")
    return out


def pad_gdn(t: dict, pre: str, tc: dict, Kn: int, Vn: int) -> dict:
    K, V = tc["linear_key_head_dim"], tc["linear_value_head_dim"]
    nk, nv = tc["linear_num_key_heads"], tc["linear_num_value_heads"]
    if Kn != 4 * K:
        raise SystemExit(f"{pre}: GDN key dim must become 4x{K} (query scale exactly halved)")
    if Vn % V:
        raise SystemExit(f"{pre}: GDN value dim {Vn} must be a multiple of {V}")
    rv = Vn // V
    kmap = [(d, d) for d in range(K)]  # zero pad
    vmap = [(d, c * V + d) for c in range(rv) for d in range(V)]  # replicate
    vfirst = [(d, d) for d in range(V)]
    out = {}

    def qkv_rows(w):
        q, k, v = w.split([nk * K, nk * K, nv * V], 0)
        return torch.cat([place_rows(q, nk, K, Kn, kmap), place_rows(k, nk, K, Kn, kmap), place_rows(v, nv, V, Vn, vmap)], 0)

    out[pre + "in_proj_qkv.weight"] = qkv_rows(t[pre + "in_proj_qkv.weight"])
    out[pre + "conv1d.weight"] = qkv_rows(t[pre + "conv1d.weight"])
    out[pre + "in_proj_z.weight"] = place_rows(t[pre + "in_proj_z.weight"], nv, V, Vn, vmap)
    out[pre + "norm.weight"] = place_vec(t[pre + "norm.weight"], V, Vn, vmap)
    out[pre + "out_proj.weight"] = place_cols(t[pre + "out_proj.weight"], nv, V, Vn, vfirst)
    if pre + "conv1d.bias" in t:
        raise SystemExit(f"{pre}conv1d.bias: not supported")
    # The core output of the padded layer is o/2 (query scale (4K)^-1/2); the gated norm over
    # copies of o/2 (mean square ms(o)/4) gives the original only with eps/4.
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--attn-head-dim", type=int, default=None,
                    help="padded attention head dim (default: 256 for targets, 64 for DFlash drafters)")
    ap.add_argument("--gdn-head-dim", type=int, default=64, help="padded GDN key and value head dim (64)")
    ap.add_argument("--eps-divisor", type=int, default=None,
                    help="rms_norm_eps is divided by this: default 4 with Gated DeltaNet layers (required there), else 1")
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args()
    cfg = json.loads((a.src / "config.json").read_text())
    kind = _kind(cfg)
    tc = _text_config(cfg)
    has_gdn = "linear_attention" in (tc.get("layer_types") or [])
    E = a.eps_divisor or (4 if has_gdn else 1)
    if has_gdn and E != 4:
        raise SystemExit("Gated DeltaNet padding needs --eps-divisor 4")
    D = tc["head_dim"]
    Dn = a.attn_head_dim or (4 * D if kind == "dflash" else 16 * D)
    if a.dst.exists():
        if not a.force:
            raise SystemExit(f"{a.dst} exists (--force)")
        shutil.rmtree(a.dst)
    a.dst.mkdir(parents=True)

    files = sorted(a.src.glob("*.safetensors"))
    if len(files) != 1:
        raise SystemExit("expected one .safetensors file")
    with safe_open(files[0], "pt") as f:
        meta = f.metadata()
        t = {k: f.get_tensor(k) for k in f.keys()}
    new = dict(t)
    layer_types = tc.get("layer_types") or ["full_attention"] * tc["num_hidden_layers"]
    if kind == "qwen3_5":
        base = "model.language_model.layers." if any(k.startswith("model.language_model.") for k in t) else "model.layers."
    elif kind == "qwen3":
        base = "model.layers."
    else:
        base = "layers."
    facts = []
    for i, lt in enumerate(layer_types):
        if lt == "linear_attention":
            new.update(pad_gdn(t, f"{base}{i}.linear_attn.", tc, a.gdn_head_dim, a.gdn_head_dim))
        elif lt in ("full_attention", "sliding_attention"):
            new.update(pad_attention(t, f"{base}{i}.self_attn.", tc, Dn, one_plus_w=(kind == "qwen3_5"),
                                     gated=(kind == "qwen3_5")))
        else:
            raise SystemExit(f"layer {i}: unsupported layer type {lt}")
    if set(new) != set(t):
        raise SystemExit("tensor set changed")

    rot = rotary_dim_of(tc, D)
    ntc = dict(tc)
    ntc["head_dim"] = Dn
    ntc["rms_norm_eps"] = tc["rms_norm_eps"] / E
    rp = dict(tc.get("rope_parameters") or {})
    if rot != D:
        rp["partial_rotary_factor"] = rot / Dn
        if int(Dn * rp["partial_rotary_factor"]) != rot:
            raise SystemExit("rotary dim not preserved")
        ntc["rope_parameters"] = rp
    facts.append(f"attention head_dim {D} -> {Dn} "
                 + ("(q/k: norm-preserving copies, v/gate/o zero-padded)" if Dn == 16 * D else
                    "(q/k/v zero-padded, k_norm weight halved)"))
    if rot != D:
        facts.append(f"partial_rotary_factor {tc['rope_parameters'].get('partial_rotary_factor')} -> {rp['partial_rotary_factor']} (rotary dim {rot} kept)")
    else:
        facts.append(f"full rotary: pair j -> pair {Dn // D}j")
    if kind == "qwen3_5":
        facts.append(f"GDN key head dim {tc['linear_key_head_dim']} -> {a.gdn_head_dim} (q/k zero-padded), "
                     f"value head dim {tc['linear_value_head_dim']} -> {a.gdn_head_dim} (v, z, norm weight replicated; out_proj reads the first copy)")
        ntc["linear_key_head_dim"] = a.gdn_head_dim
        ntc["linear_value_head_dim"] = a.gdn_head_dim
    facts.append(f"rms_norm_eps {tc['rms_norm_eps']} -> {ntc['rms_norm_eps']}"
                 + ("" if E > 1 else " (unchanged: the per-head norms then see eps 4x too large relative to their mean square)"))
    if "text_config" in cfg:
        cfg = dict(cfg)
        cfg["text_config"] = ntc
    else:
        cfg = ntc
    (a.dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in new.items()}, str(a.dst / files[0].name), metadata=meta)
    for p in a.src.iterdir():
        if p.is_file() and p.suffix != ".safetensors" and p.name != "config.json":
            shutil.copy2(p, a.dst / p.name)
    (a.dst / "PADDING.json").write_text(json.dumps({"source": str(a.src), "kind": kind, "eps_divisor": E, "facts": facts}, indent=2) + "\n")
    for line in facts:
        print(line)


if __name__ == "__main__":
    main()
