#!/usr/bin/env python3
"""Generate hsparity's MoE (``qwen3_5_moe``) fixtures and facts with HuggingFace transformers 5.23.0.

CI never runs this script: its outputs are committed under ``fixtures/moe/`` and
``fixtures/qwen3.5-35b-a3b/``, and the Rust tests only read them. It refuses any transformers other
than 5.23.0. It is deterministic (fixed seeds, one CPU thread, deterministic torch algorithms, the
deterministic safetensors writer of ``make_fixtures.py``): two runs give byte-identical files.

How to run (from the repository root, after ``make_fixtures.py``, whose tokenizer it copies):

    .venv/bin/python tools/make_moe_fixtures.py

What it writes
==============

``fixtures/moe/<layout>/`` -- one tiny ``qwen3_5_moe`` checkpoint (``Qwen3_5MoeForConditionalGeneration``,
    random weights; the same weights in every layout) in each published on-disk layout:

      qwen3.5-fused   main experts fused (``model.language_model.layers.{i}.mlp.experts.gate_up_proj``
                      [E, 2I, H] and ``.down_proj`` [E, H, I]), MTP experts per expert
                      (``mtp.layers.0.mlp.experts.{e}.{gate,up,down}_proj.weight``): Qwen3.5-35B-A3B (BF16)
      qwen3.6-fused   main and MTP experts fused (``mtp.layers.0.mlp.experts.gate_up_proj``): Qwen3.6-35B-A3B
      per-expert      every expert per expert (``...mlp.experts.{e}.{gate,up,down}_proj.weight``), the layout of
                      the FP8 checkpoints and of what ``save_pretrained`` writes for a model built with
                      ``from_config`` (asserted below: this layout's main keys are that save's keys)

    Text config MOE_TEXT_CONFIG: vocab 384 (the tiny tokenizer), hidden 32, 4 layers [linear, linear, linear,
    full] (full_attention_interval 4, as published), 2 heads / 1 kv head, head_dim 16, GDN 1 key / 2 value heads
    of dim 8, E = 8 experts, top-k = 3, moe_intermediate 16, shared expert 24 (different from 16, so a swap
    shows); vision tower MICRO_VISION_CONFIG (depth 1); one MTP layer (full attention + MoE) as the published
    checkpoints carry it (``mtp.fc``, ``mtp.pre_fc_norm_{embedding,hidden}``, ``mtp.norm``, ``mtp.layers.0.*``).
    On disk as published: BF16, except ``linear_attn.A_log`` and ``linear_attn.norm.weight`` in F32;
    ``config.json`` like the published one (no top-level ``dtype``, ``text_config.dtype = "bfloat16"``,
    ``mtp_num_hidden_layers: 1``); two shards + ``model.safetensors.index.json`` (tensors split in name order).
    Each layout holds ``tokenizer.json`` / ``tokenizer_config.json`` (copied from ``fixtures/tiny-qwen3_5``),
    ``prompts.jsonl`` (p0: 11 tokens, p1: PROMPT_P1, 25 tokens) and ``golden/``:

    * ``<path>.f32.safetensors`` -- ``from_pretrained(dir, dtype=torch.float32, attn_implementation="eager")``
    * ``<path>.bf16.safetensors`` -- ``from_pretrained(dir, attn_implementation="eager")`` (dtype "auto": every
      class loads bf16 here, asserted)

      for ``<path>`` in causal-lm (AutoModelForCausalLM), vlm (AutoModel), image-text-to-text
      (AutoModelForImageTextToText); experts implementation: the default (``grouped_mm``, asserted).
      hsparity dump format v1 (docs/dump-format.md; ``src/dump.rs``), one forward per prompt
      (``output_hidden_states=True, use_cache=False``), plus per decoder layer ``i`` the router of its MoE block
      (a forward hook on ``mlp.gate``, ``Qwen3_5MoeTopKRouter``):
        ``p{k}.router.{i}.logits``   F32 [T, E]  router logits in the model dtype (``.float()``)
        ``p{k}.router.{i}.indices``  I64 [T, k]  ``torch.topk`` order (descending probability, CPU tie order)
        ``p{k}.router.{i}.weights``  F32 [T, k]  renormalised routing weights in the model dtype (``.float()``)
      ``p{k}.logits`` only in causal-lm (image-text-to-text's are bitwise equal, asserted, not stored).
      ``__metadata__``: format, checkpoint, loading_path, class, dtype, num_layers, tool_version,
      experts_implementation, num_experts, top_k. The three layouts' goldens are bitwise equal (asserted).

    * ``load_report.json`` -- per Auto class, from a real ``from_pretrained`` (dtype "auto") with transformers'
      own key routing recorded (``core_model_loading.rename_source_key`` wrapped): class, config class, dtype,
      parameter dtypes, state-dict tensors, missing / unexpected / mismatched keys, conversion errors, the LOAD
      REPORT warnings, the weight transforms that fired (``model._weight_conversions``, with their scope), and
      the counts (checkpoint keys consumed / converted / converted-then-dropped / dropped by an ignore rule /
      unexpected; parameters loaded / converted; per fusion rule: how many checkpoint keys fused into how
      many parameters) and every fused parameter with its ordered source keys. The same counts computed on the
      meta device (``meta_counts``, the method used for the 35B-A3B) are asserted equal. Plus what
      ``save_pretrained`` writes for the loaded model (fused or per-expert experts).

``fixtures/moe/errors/<name>/`` -- broken per-expert layouts, ``config.json`` + ``tensors.json`` (names,
    dtypes, shapes; no data) + ``load_report.json`` (what each Auto class does with a real checkpoint of those
    headers, written to a temporary directory: the error it raises, with the LOAD REPORT, or what it silently
    loads). Layer 1 of the main model is broken:

      missing-expert      expert 7 (the last) absent entirely: 7 experts on disk
      missing-projection  expert 5 has gate_proj and down_proj but no up_proj
      index-gap           expert 5 absent and an expert 8 present: 8 experts on disk, indices 0-4, 6-8
      unequal-shapes      expert 5's projections have intermediate size 8 instead of 16

``fixtures/moe/block/``
    * ``moe_block.safetensors`` -- one ``Qwen3_5MoeSparseMoeBlock`` in isolation (BLOCK_CONFIG: H 32, E 16,
      top-4, I 16, shared 24; router rows 3, 7 and 11 identical so that experts 3, 7 and 11 always tie), T = 64
      tokens, run in f32 and in bf16 with the same (bf16-representable) weights and inputs, default experts
      implementation ``grouped_mm``. Inputs (BF16): ``hidden_states`` [T, H], ``gate.weight`` [E, H],
      ``experts.gate_up_proj`` [E, 2I, H], ``experts.down_proj`` [E, H, I],
      ``shared_expert.{gate,up,down}_proj.weight``, ``shared_expert_gate.weight`` [1, H]. Outputs (F32, per dtype
      ``d`` in f32 / bf16): ``d.router_logits`` [T, E], ``d.topk_indices`` I64 [T, k], ``d.routing_weights``
      [T, k], ``d.experts_output`` [T, H] (routed experts), ``d.shared_output`` [T, H]
      (``sigmoid(shared_expert_gate(h)) * shared_expert(h)``), ``d.output`` [T, H], and
      ``d.output_eager`` [T, H] (the same block with ``experts_implementation="eager"``).
    * ``topk_ties.safetensors`` -- rows of small integers (many exact ties) and ``torch.topk``'s indices on CPU:
      ``n{n}_k{k}.values`` BF16 [R, n] (integers 0..199, exact; taken as float32), ``n{n}_k{k}.indices`` I64 [R, k].
    * ``facts.json`` -- the MoE numerics facts measured here: the top-k tie rule (a port of libstdc++'s
      ``nth_element`` + ``sort`` / ``partial_sort`` with torch's comparator reproduces ``torch.topk`` on every
      tie row), the router's softmax / top-k / renormalisation / cast order against alternatives, ``grouped_mm``
      against a per-expert GEMM + f32 sum and against the eager loop, the experts implementation picked.

``fixtures/qwen3.5-35b-a3b/`` -- reads the committed ``config.json`` (the published Qwen3.5-35B-A3B config) and
    ``tensors.json`` (the published layout's names, dtypes and shapes, 1811 tensors) and writes ``expected_counts.json``: per layout (the published
    one; fused MTP; per-expert everything, each derived from the tensor list by LAYOUT_RULES) and per Auto
    class, the counts transformers gives on the meta device (``meta_counts``): state-dict tensors, checkpoint
    keys consumed / converted / converted-then-dropped / dropped / unexpected, missing, parameters converted,
    per fusion rule the key and parameter counts, the reported unexpected keys.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import shutil
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fixture_configs as fc  # noqa: E402  (tools/ sibling: config pieces shared with the other generators)
import make_fixtures as mf  # noqa: E402  (tools/ sibling: env, determinism, safetensors writer, helpers)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors import safe_open  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

import transformers  # noqa: E402
import transformers.core_model_loading as cml  # noqa: E402
from transformers import (  # noqa: E402
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    Qwen3_5MoeConfig,
    Qwen3_5MoeForConditionalGeneration,
    Qwen3_5MoeTextConfig,
)
from transformers.conversion_mapping import get_model_conversion_mapping  # noqa: E402
from transformers.integrations import moe as hf_moe  # noqa: E402
from transformers.modeling_utils import LoadStateDictConfig  # noqa: E402
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as mqm  # noqa: E402

REPO = mf.REPO
EXPECTED_TRANSFORMERS = "5.23.0"
MOE_REL = "fixtures/moe"
A35_REL = "fixtures/qwen3.5-35b-a3b"
SEED = mf.SEED + 300

MOE_LAYER_TYPES = fc.hybrid_layer_types(linear_per_full=3, blocks=1)
MOE_TEXT_CONFIG = dict(
    vocab_size=mf.TOKENIZER_VOCAB,
    hidden_size=32,
    num_hidden_layers=len(MOE_LAYER_TYPES),
    layer_types=MOE_LAYER_TYPES,
    **fc.attention_fields(heads=2, kv_heads=1, head_dim=16),
    **fc.gated_deltanet_fields(key_heads=1, value_heads=2, head_dim=8),
    moe_intermediate_size=16,
    shared_expert_intermediate_size=24,
    num_experts=8,
    num_experts_per_tok=3,
    rms_norm_eps=1e-6,
    max_position_embeddings=128,
    eos_token_id=0,
    tie_word_embeddings=False,
    rope_parameters=fc.interleaved_mrope([1, 1, 0]),
)
MICRO_VISION_CONFIG = fc.MICRO_VISION_CONFIG
# inert extra text_config fields of the published config.json (kept so the fixture reads like it)
PUBLISHED_EXTRA_TEXT_FIELDS = {"mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False,
                               "mamba_ssm_dtype": "float32", "dtype": "bfloat16"}
F32_ON_DISK = ("linear_attn.A_log", "linear_attn.norm.weight")  # as published; everything else BF16

LAYOUTS = ["qwen3.5-fused", "qwen3.6-fused", "per-expert"]
LAYOUT_DOC = {
    "qwen3.5-fused": "main experts fused (gate_up_proj [E, 2I, H], down_proj [E, H, I]); MTP experts per expert "
                     "(Qwen3.5-35B-A3B BF16 layout)",
    "qwen3.6-fused": "main and MTP experts fused (Qwen3.6-35B-A3B layout)",
    "per-expert": "every expert per expert: mlp.experts.{e}.{gate,up,down}_proj.weight (FP8 checkpoints; "
                  "save_pretrained of a from_config model)",
}
PROMPT_P1 = "Each token goes to three of eight experts."

PATHS = mf.PATHS  # (name, auto class name, auto class)
RULE_GATE_UP = ("mlp.experts.*.gate_proj.weight + mlp.experts.*.up_proj.weight -> mlp.experts.gate_up_proj "
                "[MergeModulelist(dim=0), Concatenate(dim=1)]")
RULE_DOWN = "mlp.experts.*.down_proj.weight -> mlp.experts.down_proj [MergeModulelist(dim=0)]"

BLOCK_CONFIG = dict(hidden_size=32, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=16,
                    shared_expert_intermediate_size=24, hidden_act="silu")
BLOCK_TOKENS = 64
BLOCK_TIED_ROWS = (3, 7, 11)

TIE_CASES = [(8, 3), (8, 2), (12, 2), (16, 4), (64, 4), (256, 8), (512, 8)]
TIE_ROWS = 48


def log(*a):
    print(*a, flush=True)


def rule_of(source_pattern: str | None) -> str | None:
    if source_pattern is None:
        return None
    return RULE_DOWN if "down_proj" in source_pattern else RULE_GATE_UP


# ------------------------------------------------------------------------------------------------
# Transformers' own key routing, recorded
# ------------------------------------------------------------------------------------------------
class RoutingRecorder:
    """Wraps ``core_model_loading.rename_source_key`` (looked up as a module global by
    ``convert_and_load_state_dict_in_model``) and records, per checkpoint key, the last call's result:
    ``(renamed_key, converter_source_pattern)``. The loader calls it a second time, with no transforms, only
    when the first result is not a model key but the original key is (its fallback); the last call wins."""

    def __init__(self):
        self.calls: list[tuple[str, str, str | None]] = []
        self._orig = None

    def __enter__(self):
        self._orig = cml.rename_source_key
        orig = self._orig

        def wrapped(source_key, *a, **k):
            r = orig(source_key, *a, **k)
            self.calls.append((source_key, r[0], r[1]))
            return r

        cml.rename_source_key = wrapped
        self.calls.clear()
        return self

    def __exit__(self, *exc):
        cml.rename_source_key = self._orig
        return False

    def routes(self) -> dict[str, tuple[str, str | None]]:
        out = {}
        for o, r, p in self.calls:
            out[o] = (r, p)
        return out


def summarise_routing(routes: dict, model_keys: set, unexpected_reported: set, ckpt_keys: list[str]) -> dict:
    """Per-key fates -> the counts of the load report (see module docstring)."""
    assert set(routes) == set(ckpt_keys), (len(routes), len(ckpt_keys))
    consumed, converted, conv_dropped, dropped, unexpected = [], [], [], [], []
    fused = defaultdict(lambda: {"rule": None, "sources": []})
    by_rule = defaultdict(lambda: {"checkpoint_keys": 0, "parameters": set()})
    by_rule_dropped = defaultdict(lambda: {"checkpoint_keys": 0, "targets": set()})
    for key in sorted(ckpt_keys, key=cml.dot_natural_key):  # the loader's own processing order
        renamed, pattern = routes[key]
        if renamed in model_keys:
            consumed.append(key)
            if pattern is not None:
                converted.append(key)
                r = rule_of(pattern)
                fused[renamed]["rule"] = r
                fused[renamed]["sources"].append((pattern, key))
                by_rule[r]["checkpoint_keys"] += 1
                by_rule[r]["parameters"].add(renamed)
            continue
        if pattern is not None:
            conv_dropped.append(key)
            r = rule_of(pattern)
            by_rule_dropped[r]["checkpoint_keys"] += 1
            by_rule_dropped[r]["targets"].add(renamed)
        # a converter reports its target names (one name for many keys); otherwise the renamed key
        if renamed in unexpected_reported:
            unexpected.append(key)
        else:
            dropped.append(key)
    params = []
    for target in sorted(fused, key=cml.dot_natural_key):
        f = fused[target]
        # Concatenate keeps the converter's source-pattern order (gate before up); each pattern's list
        # is in the loader's (dot_natural_key) order
        order = {}
        for pattern, key in f["sources"]:
            order.setdefault(pattern, []).append(key)
        patterns = sorted(order, key=lambda p: 0 if "gate_proj" in p else (1 if "up_proj" in p else 2))
        sources = [k for p in patterns for k in order[p]]
        first = sources[0].split(".")
        fused_name = ".".join(first[:-3] + ["gate_up_proj" if f["rule"] == RULE_GATE_UP else "down_proj"])
        # ``as_checkpoint_key``: the name the fused tensor has in a fused checkpoint (same prefix as the sources)
        params.append({"parameter": target, "as_checkpoint_key": fused_name, "rule": f["rule"], "sources": sources})
    return {
        "checkpoint_keys": len(ckpt_keys),
        "checkpoint_keys_consumed": len(consumed),
        "checkpoint_keys_converted": len(converted),
        "checkpoint_keys_converted_then_dropped": len(conv_dropped),
        "checkpoint_keys_dropped_by_rule": len(dropped),
        "checkpoint_keys_unexpected": len(unexpected),
        "parameters_converted": len(params),
        "converted_by_rule": {r: {"checkpoint_keys": v["checkpoint_keys"], "parameters": len(v["parameters"])}
                              for r, v in sorted(by_rule.items())},
        "converted_then_dropped_by_rule": {r: {"checkpoint_keys": v["checkpoint_keys"],
                                               "reported_as": sorted(v["targets"])}
                                           for r, v in sorted(by_rule_dropped.items())},
        "fused_parameters": params,
        "dropped_keys_by_prefix": dict(sorted(Counter(prefix_of(k) for k in dropped).items())),
    }


def prefix_of(k: str) -> str:
    for p in ("model.visual.", "mtp.", "lm_head.", "model.language_model.", "model."):
        if k.startswith(p):
            return p
    return "<other>"


def transforms_desc(ts) -> list[dict]:
    return [{"type": type(t).__name__, "source_patterns": list(t.source_patterns),
             "target_patterns": list(t.target_patterns), "scope_prefix": t.scope_prefix,
             "operations": [repr_op(o) for o in getattr(t, "operations", [])]}
            for t in ts]


def repr_op(op) -> str:
    return f"{type(op).__name__}(dim={getattr(op, 'dim', None)})"


def meta_counts(auto_cls, config, specs: list[tuple[str, str, list[int]]]) -> dict:
    """What ``auto_cls`` does with a checkpoint of these headers, on the meta device: the model built with
    ``from_config`` under ``torch.device("meta")``, transformers' own ``get_model_conversion_mapping`` and
    ``convert_and_load_state_dict_in_model`` (device_map {"": "meta"}) on meta tensors of the given shapes and
    dtypes, then ``_adjust_missing_and_unexpected_keys`` (the ignore rules). No data is read or allocated."""
    dt = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16}
    with torch.device("meta"):
        model = auto_cls.from_config(config)
    wm = get_model_conversion_mapping(model)
    lc = LoadStateDictConfig(device_map={"": "meta"}, dtype=torch.bfloat16, weight_mapping=wm,
                             dtype_plan=model._get_dtype_plan(torch.bfloat16))
    sd = {n: torch.empty(s, dtype=dt[d], device="meta") for n, d, s in specs}
    with RoutingRecorder() as rec:
        info, _ = cml.convert_and_load_state_dict_in_model(model, sd, lc)
    model._adjust_missing_and_unexpected_keys(info)
    msd = model.state_dict()
    s = summarise_routing(rec.routes(), set(msd), set(info.unexpected_keys), [n for n, _, _ in specs])
    s.pop("fused_parameters")
    return {
        "class": type(model).__name__,
        "state_dict_tensors": len(msd),
        "numel": sum(p.numel() for p in model.parameters()),
        **s,
        "missing_keys": sorted(info.missing_keys),
        "unexpected_keys": sorted(info.unexpected_keys),
        "mismatched_keys": sorted(str(x) for x in info.mismatched_keys),
        "conversion_errors": sorted(info.conversion_errors),
        "transforms_used": [t["type"] + ": " + " + ".join(t["source_patterns"]) + " -> "
                            + " + ".join(t["target_patterns"]) + f" (scope {t['scope_prefix']!r})"
                            for t in transforms_desc(getattr(model, "_weight_conversions", []))],
    }


# ------------------------------------------------------------------------------------------------
# The tiny checkpoint
# ------------------------------------------------------------------------------------------------
def moe_config() -> Qwen3_5MoeConfig:
    return Qwen3_5MoeConfig(text_config=dict(MOE_TEXT_CONFIG), vision_config=dict(MICRO_VISION_CONFIG),
                            tie_word_embeddings=False)


@torch.no_grad()
def randomise_moe(model: torch.nn.Module, gen: torch.Generator):
    """``make_fixtures.randomise`` for the dense parts (norms, GDN, attention, vision), then the MoE parameters:
    router ``mlp.gate.weight`` [E, H] ~ N(0, 1/H) (logits ~ N(0, 1) on normed inputs), expert stacks with a
    per-expert fan-in (the last dimension): ``gate_up_proj`` [E, 2I, H] ~ N(0, 1/H), ``down_proj`` [E, H, I] ~
    N(0, 0.25/I); the shared expert as a dense MLP; ``shared_expert_gate.weight`` [1, H] ~ N(0, 1/H)."""
    mf.randomise(model, gen)
    for name, p in model.named_parameters():
        if name.endswith("mlp.experts.gate_up_proj"):
            p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
        elif name.endswith("mlp.experts.down_proj"):
            p.copy_(torch.randn(p.shape, generator=gen) * (0.5 / p.shape[-1] ** 0.5))


def mtp_tensors(gen: torch.Generator, tc: dict = MOE_TEXT_CONFIG) -> dict[str, torch.Tensor]:
    """The MTP layer as published (17 + 3E keys per expert) for text config ``tc``, random, f32; experts per
    expert."""
    H, nh, nkv, hd = tc["hidden_size"], tc["num_attention_heads"], tc["num_key_value_heads"], tc["head_dim"]
    E, I, S = tc["num_experts"], tc["moe_intermediate_size"], tc["shared_expert_intermediate_size"]

    def w(*shape):
        return torch.randn(shape, generator=gen) / shape[-1] ** 0.5

    def n(*shape):
        return torch.randn(shape, generator=gen) * 0.1

    out = {
        "mtp.fc.weight": w(H, 2 * H),
        "mtp.norm.weight": n(H),
        "mtp.pre_fc_norm_embedding.weight": n(H),
        "mtp.pre_fc_norm_hidden.weight": n(H),
        "mtp.layers.0.input_layernorm.weight": n(H),
        "mtp.layers.0.post_attention_layernorm.weight": n(H),
        "mtp.layers.0.self_attn.q_proj.weight": w(2 * nh * hd, H),
        "mtp.layers.0.self_attn.k_proj.weight": w(nkv * hd, H),
        "mtp.layers.0.self_attn.v_proj.weight": w(nkv * hd, H),
        "mtp.layers.0.self_attn.o_proj.weight": w(H, nh * hd),
        "mtp.layers.0.self_attn.q_norm.weight": n(hd),
        "mtp.layers.0.self_attn.k_norm.weight": n(hd),
        "mtp.layers.0.mlp.gate.weight": w(E, H),
        "mtp.layers.0.mlp.shared_expert.gate_proj.weight": w(S, H),
        "mtp.layers.0.mlp.shared_expert.up_proj.weight": w(S, H),
        "mtp.layers.0.mlp.shared_expert.down_proj.weight": w(H, S),
        "mtp.layers.0.mlp.shared_expert_gate.weight": w(1, H),
    }
    for e in range(E):
        out[f"mtp.layers.0.mlp.experts.{e}.gate_proj.weight"] = w(I, H)
        out[f"mtp.layers.0.mlp.experts.{e}.up_proj.weight"] = w(I, H)
        out[f"mtp.layers.0.mlp.experts.{e}.down_proj.weight"] = w(H, I)
    return out


def disk_dtype(name: str, t: torch.Tensor) -> torch.Tensor:
    if name.endswith(F32_ON_DISK):
        return t.float().contiguous()
    return t.to(torch.bfloat16).contiguous()


def unfuse(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """Fused ``{prefix}mlp.experts.{gate_up_proj,down_proj}`` -> per-expert keys (gate rows first), everywhere
    the key starts with ``prefix`` (the inverse of transformers' MergeModulelist + Concatenate)."""
    out = {}
    for k, t in tensors.items():
        if k.startswith(prefix) and k.endswith("mlp.experts.gate_up_proj"):
            base = k[: -len("gate_up_proj")]
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :inter].clone()
                out[f"{base}{e}.up_proj.weight"] = t[e, inter:].clone()
        elif k.startswith(prefix) and k.endswith("mlp.experts.down_proj"):
            base = k[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e].clone()
        else:
            out[k] = t
    return out


def fuse(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """Per-expert keys under ``prefix`` -> fused ``gate_up_proj`` / ``down_proj`` (torch.stack, torch.cat dim 1)."""
    groups = defaultdict(dict)
    out = {}
    for k, t in tensors.items():
        parts = k.split(".")
        if k.startswith(prefix) and len(parts) >= 4 and parts[-4] == "experts" and parts[-3].isdigit():
            base = ".".join(parts[:-3])
            groups[base][(int(parts[-3]), parts[-2])] = t
        else:
            out[k] = t
    for base, g in groups.items():
        E = 1 + max(e for e, _ in g)
        gate = torch.stack([g[(e, "gate_proj")] for e in range(E)])
        up = torch.stack([g[(e, "up_proj")] for e in range(E)])
        out[f"{base}.gate_up_proj"] = torch.cat([gate, up], dim=1).contiguous()
        out[f"{base}.down_proj"] = torch.stack([g[(e, "down_proj")] for e in range(E)]).contiguous()
    return out


def layout_tensors(fused_main: dict[str, torch.Tensor], mtp_per_expert: dict[str, torch.Tensor],
                   layout: str) -> dict[str, torch.Tensor]:
    if layout == "qwen3.5-fused":
        return {**fused_main, **mtp_per_expert}
    if layout == "qwen3.6-fused":
        return {**fused_main, **fuse(mtp_per_expert, "mtp.")}
    if layout == "per-expert":
        return {**unfuse(fused_main, "model.language_model."), **mtp_per_expert}
    raise ValueError(layout)


def write_checkpoint(ckpt: Path, tensors: dict[str, torch.Tensor], config_json: dict, shards: int = 2):
    ckpt.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    per = math.ceil(len(names) / shards)
    weight_map, total_size, total_params = {}, 0, 0
    for i in range(shards):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        chunk = {n: tensors[n] for n in names[i * per:(i + 1) * per]}
        mf.save_safetensors(ckpt / fname, chunk, {"format": "pt"})
        for n, t in chunk.items():
            weight_map[n] = fname
            total_size += t.numel() * t.element_size()
            total_params += t.numel()
    mf.write_json(ckpt / "model.safetensors.index.json",
                  {"metadata": {"total_parameters": total_params, "total_size": total_size},
                   "weight_map": dict(sorted(weight_map.items()))})
    (ckpt / "config.json").write_text(json.dumps(config_json, indent=2, sort_keys=True) + "\n")


def published_like_config(model_config: Qwen3_5MoeConfig) -> dict:
    """config.json as the published checkpoint has it: no top-level dtype, text_config.dtype bfloat16."""
    with tempfile.TemporaryDirectory() as d:
        model_config.save_pretrained(d)
        cfg = json.loads((Path(d) / "config.json").read_text())
    cfg.pop("dtype", None)
    cfg["architectures"] = ["Qwen3_5MoeForConditionalGeneration"]
    cfg["text_config"].update(PUBLISHED_EXTRA_TEXT_FIELDS)
    return cfg


# ------------------------------------------------------------------------------------------------
# Loading, goldens, load report
# ------------------------------------------------------------------------------------------------
class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.records: list[str] = []

    def emit(self, record):
        self.records.append(f"{record.levelname} {record.name}: {mf._ANSI.sub('', record.getMessage())}")


def condense(text: str, tmp: str | None = None) -> str:
    """A LOAD REPORT, deterministic and short: table cells stripped of their padding, rows sorted (transformers
    prints them in set order), Python tracebacks reduced to the exception lines, the temporary checkpoint
    directory replaced by ``<tmp_checkpoint>``."""
    if tmp:
        text = text.replace(tmp, "<tmp_checkpoint>")
    out, rows, skip_code = [], [], False
    for ln in text.split("\n"):
        if ln.startswith("Traceback (most recent call last):"):
            continue
        if ln.startswith("  File "):
            skip_code = True
            continue
        if skip_code and (ln.startswith("    ") or not ln.strip()):
            continue
        skip_code = False
        if " | " in ln or (ln.startswith("---") and "+" in ln):
            cells = [c.strip() for c in ln.split("|")]
            if ln.startswith("---"):
                out.append("---")
            elif cells[0] == "Key":
                out.append(" | ".join(c for c in cells if c))
            else:
                rows.append(" | ".join(c for c in cells if c))
            continue
        if rows:
            out.extend(sorted(rows))
            rows = []
        if ln.strip():
            out.append(ln.rstrip())
    out.extend(sorted(rows))
    return "\n".join(out)


def load_recorded(auto_cls, ckpt: str, **kw):
    """``from_pretrained(ckpt, output_loading_info=True, **kw)`` with the key routing, the loading info handed to
    ``log_state_dict_report`` (so it is known even when that raises) and the WARNING-level messages recorded;
    returns (model or None, info, records, routes, exception or None)."""
    cap = _Capture()
    lg = logging.getLogger("transformers")
    lg.addHandler(cap)
    seen = {}
    import transformers.modeling_utils as mu
    orig_report = mu.log_state_dict_report

    def report(*a, **k):
        li = k.get("loading_info")
        seen["info"] = {"missing_keys": set(li.missing_keys), "unexpected_keys": set(li.unexpected_keys),
                        "mismatched_keys": set(li.mismatched_keys), "error_msgs": list(li.error_msgs),
                        "conversion_errors": dict(li.conversion_errors)}
        return orig_report(*a, **k)

    mu.log_state_dict_report = report
    mf.setup_determinism()
    torch.manual_seed(mf.DIV_INIT_SEED)
    try:
        with RoutingRecorder() as rec:
            try:
                model, _ = auto_cls.from_pretrained(ckpt, output_loading_info=True, **kw)
                err = None
            except Exception as e:  # noqa: BLE001 -- recorded: this is the fact we want
                model, err = None, e
    finally:
        lg.removeHandler(cap)
        mu.log_state_dict_report = orig_report
    if model is not None:
        model.eval()
    tmp = ckpt if ckpt.startswith(tempfile.gettempdir()) else None
    return model, seen.get("info"), [condense(r, tmp) for r in cap.records], rec.routes(), err


def checkpoint_specs(ckpt: Path) -> list[tuple[str, str, list[int]]]:
    specs = []
    for fname in mf.checkpoint_files(ckpt):
        with safe_open(str(ckpt / fname), "pt") as f:
            for k in f.keys():
                sl = f.get_slice(k)
                specs.append((k, sl.get_dtype(), list(sl.get_shape())))
    return sorted(specs)


def router_hooks(model, store: list):
    handles = []
    for mod in model.modules():
        if isinstance(mod, mqm.Qwen3_5MoeTopKRouter):
            def hook(_m, _a, out):
                logits, scores, idx = out
                store.append((logits.float().contiguous(), idx.to(torch.int64).contiguous(),
                              scores.float().contiguous()))
            handles.append(mod.register_forward_hook(hook))
    return handles


@torch.no_grad()
def golden_dump(model, prompts_ids, path_name: str, ckpt_rel: str, dtype_name: str) -> dict[str, torch.Tensor]:
    N = MOE_TEXT_CONFIG["num_hidden_layers"]
    store: list = []
    handles = router_hooks(model, store)
    try:
        tensors, _ = mf.forward_dump(model, prompts_ids, N, layer_cls=mqm.Qwen3_5MoeDecoderLayer)
    finally:
        for h in handles:
            h.remove()
    assert len(store) == N * len(prompts_ids), len(store)
    for k in range(len(prompts_ids)):
        for i in range(N):
            logits, idx, w = store[k * N + i]
            tensors[f"p{k}.router.{i}.logits"] = logits
            tensors[f"p{k}.router.{i}.indices"] = idx
            tensors[f"p{k}.router.{i}.weights"] = w
    return tensors


def golden_metadata(model, path_name, ckpt_rel, dtype_name) -> dict[str, str]:
    tc = MOE_TEXT_CONFIG
    return {
        "format": "hsparity.dump.v1",
        "checkpoint": ckpt_rel,
        "loading_path": path_name,
        "class": type(model).__name__,
        "dtype": dtype_name,
        "num_layers": str(tc["num_hidden_layers"]),
        "tool_version": f"transformers {transformers.__version__}",
        "experts_implementation": str(model.config.get_text_config()._experts_implementation),
        "num_experts": str(tc["num_experts"]),
        "top_k": str(tc["num_experts_per_tok"]),
    }


def path_report(path_name, auto_name, model, info, records, routes, err, ckpt_keys, model_keys=None) -> dict:
    """``model_keys``: the state-dict keys (from a meta-device build) when ``from_pretrained`` raised."""
    entry = {"name": path_name, "auto_class": auto_name, "loaded": model is not None}
    if model is not None:
        sd = model.state_dict()
        params = list(model.named_parameters())
        dtypes = Counter(str(p.dtype).replace("torch.", "") for _, p in params)
        entry.update({
            "class": type(model).__name__,
            "config_class": type(model.config).__name__,
            "model_type": model.config.model_type,
            "dtype": dtypes.most_common(1)[0][0],
            "parameter_dtypes": dict(sorted(dtypes.items())),
            "experts_implementation": model.config.get_text_config()._experts_implementation,
            "state_dict_tensors": len(sd),
            "numel": sum(p.numel() for _, p in params),
        })
        model_keys = set(sd)
    else:
        entry.update({"error_type": type(err).__name__, "error": mf._ANSI.sub("", str(err)).strip()})
    unexpected = set(info["unexpected_keys"])
    missing = sorted(info["missing_keys"])
    s = summarise_routing(routes, set(model_keys), unexpected, ckpt_keys)
    if model is not None:
        entry["parameters_from_checkpoint"] = entry["state_dict_tensors"] - len(missing)
    entry.update({
        **s,
        "missing_keys": missing,
        "unexpected_keys": sorted(unexpected),
        "mismatched_keys": sorted(str(x) for x in info["mismatched_keys"]),
        "conversion_errors": {k: [ln for ln in v.strip().split("\n") if ln.strip()][-2:]
                              for k, v in sorted(info["conversion_errors"].items())},
        "error_msgs": [str(x) for x in info["error_msgs"]],
        "load_warnings": records,
    })
    if model is not None:
        entry["transforms_used"] = transforms_desc(getattr(model, "_weight_conversions", []))
    return entry


def saved_layout(model) -> dict:
    """What save_pretrained (default save_original_format=True) writes for this loaded model."""
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        keys = []
        for f in sorted(Path(d).glob("*.safetensors")):
            with safe_open(str(f), "pt") as fh:
                keys.extend(fh.keys())
    main = [k for k in keys if ".mlp.experts." in k and not k.startswith("mtp.")]
    fused = any(k.endswith("mlp.experts.gate_up_proj") for k in main)
    per = any(k.endswith(".gate_proj.weight") for k in main)
    return {"tensors": len(keys),
            "main_experts": "fused" if fused and not per else ("per-expert" if per and not fused else "mixed"),
            "first_expert_keys": sorted(main, key=cml.dot_natural_key)[:3]}


def make_layout(layout: str, tensors: dict, config_json: dict, prompts, prompts_ids,
                tok_src: Path) -> tuple[dict, dict]:
    ckpt_rel = f"{MOE_REL}/{layout}"
    ckpt = REPO / ckpt_rel
    shutil.rmtree(ckpt, ignore_errors=True)
    (ckpt / "golden").mkdir(parents=True)
    write_checkpoint(ckpt, tensors, config_json)
    for fname in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tok_src / fname, ckpt / fname)
    with open(ckpt / "prompts.jsonl", "w") as f:
        for p in prompts:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    specs = checkpoint_specs(ckpt)
    ckpt_keys = [n for n, _, _ in specs]
    config_obj = AutoConfig.from_pretrained(str(ckpt))
    report = {
        "tool_version": f"transformers {transformers.__version__}",
        "torch_version": torch.__version__.split("+")[0],
        "layout": layout,
        "describes": LAYOUT_DOC[layout],
        "checkpoint": ckpt_rel,
        "load_arguments": "torch.manual_seed(%d); from_pretrained(checkpoint, output_loading_info=True, "
                          "attn_implementation='eager')  # dtype defaults to 'auto'" % mf.DIV_INIT_SEED,
        "config_json": {k: config_json.get(k, "<absent>") for k in ("architectures", "model_type", "dtype")}
        | {f"text_config.{k}": config_json["text_config"].get(k, "<absent>")
           for k in ("dtype", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                     "shared_expert_intermediate_size", "mtp_num_hidden_layers")},
        "checkpoint_files": mf.checkpoint_files(ckpt),
        "checkpoint_tensors": len(specs),
        "checkpoint_dtypes": dict(sorted(Counter(d for _, d, _ in specs).items())),
        "checkpoint_tensors_by_prefix": dict(sorted(Counter(prefix_of(k) for k in ckpt_keys).items())),
        "checkpoint_expert_keys": {
            "main_fused": sum(k.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj"))
                              for k in ckpt_keys if not k.startswith("mtp.")),
            "main_per_expert": sum(".mlp.experts." in k and k.endswith("_proj.weight")
                                   for k in ckpt_keys if not k.startswith("mtp.")),
            "mtp_fused": sum(k.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj"))
                             for k in ckpt_keys if k.startswith("mtp.")),
            "mtp_per_expert": sum(".mlp.experts." in k and k.endswith("_proj.weight")
                                  for k in ckpt_keys if k.startswith("mtp.")),
        },
        "prompt_token_counts": [len(p) for p in prompts_ids],
        "paths": [],
    }
    goldens = {}
    for path_name, auto_name, auto_cls in PATHS:
        model, info, records, routes, err = load_recorded(auto_cls, ckpt_rel, attn_implementation="eager")
        assert err is None, (layout, path_name, err)
        entry = path_report(path_name, auto_name, model, info, records, routes, err, ckpt_keys)
        entry["meta_counts_equal"] = compare_meta(entry, meta_counts(auto_cls, config_obj, specs))
        entry["save_pretrained_writes"] = saved_layout(model)
        report["paths"].append(entry)
        # goldens: dtype "auto" (this model) and float32
        for dname, m in (("bf16", model), ("f32", None)):
            if m is None:
                m, _, _, _, e2 = load_recorded(auto_cls, ckpt_rel, dtype=torch.float32, attn_implementation="eager")
                assert e2 is None
            want = torch.bfloat16 if dname == "bf16" else torch.float32
            assert all(p.dtype == want for p in m.parameters()), (layout, path_name, dname)
            assert m.config.get_text_config()._experts_implementation == "grouped_mm"
            t = golden_dump(m, prompts_ids, path_name, ckpt_rel, dname)
            goldens[(path_name, dname)] = t
            saved = {k: v for k, v in t.items() if path_name == "causal-lm" or not k.endswith(".logits")}
            out = ckpt / "golden" / f"{path_name}.{dname}.safetensors"
            mf.save_safetensors(out, saved, golden_metadata(m, path_name, ckpt_rel, dname))
            del m
        del model
    # cross-path: every path's hidden states, router choices and (causal-lm / image-text-to-text) logits
    for dname in ("f32", "bf16"):
        ref = goldens[("causal-lm", dname)]
        for other in ("vlm", "image-text-to-text"):
            for k, v in goldens[(other, dname)].items():
                assert torch.equal(v, ref[k]), (layout, dname, other, k)
    report["cross_path_goldens"] = "bitwise equal on every shared key (hidden states, router logits / indices / " \
                                   "weights, logits of causal-lm and image-text-to-text), per dtype (asserted)"
    report["golden_max_abs_h_per_prompt"] = {
        dname: [round(float(max(goldens[("causal-lm", dname)][f"p{k}.hidden_states.{i}"].abs().max()
                                for i in range(MOE_TEXT_CONFIG["num_hidden_layers"]))), 4)
                for k in range(len(prompts_ids))] for dname in ("f32", "bf16")}
    report["golden_router_choices_f32_vs_bf16"] = routing_agreement(goldens[("causal-lm", "f32")],
                                                                    goldens[("causal-lm", "bf16")], len(prompts_ids))
    mf.write_json(ckpt / "golden" / "load_report.json", report)
    return report, {k: v for k, v in goldens.items()}


def routing_agreement(a: dict, b: dict, n_prompts: int) -> dict:
    """token x slot choices that differ between two goldens, per layer (summed over prompts), as sets per token."""
    N = MOE_TEXT_CONFIG["num_hidden_layers"]
    per_layer = []
    for i in range(N):
        diff_slots, diff_sets, total = 0, 0, 0
        for k in range(n_prompts):
            x, y = a[f"p{k}.router.{i}.indices"], b[f"p{k}.router.{i}.indices"]
            diff_slots += int((x != y).sum())
            diff_sets += sum(set(r.tolist()) != set(s.tolist()) for r, s in zip(x, y))
            total += x.numel()
        per_layer.append({"slots": total, "slots_differing": diff_slots, "tokens_with_other_expert_set": diff_sets})
    return {"per_layer": per_layer}


COUNT_FIELDS = ("checkpoint_keys_consumed", "checkpoint_keys_converted",
                "checkpoint_keys_converted_then_dropped", "checkpoint_keys_dropped_by_rule",
                "checkpoint_keys_unexpected", "parameters_converted", "converted_by_rule", "missing_keys",
                "unexpected_keys", "mismatched_keys")


def compare_meta(entry: dict, meta: dict) -> bool:
    """The meta-device counts equal the real load's (``conversion_errors`` compared by key)."""
    if "state_dict_tensors" in entry:
        assert entry["state_dict_tensors"] == meta["state_dict_tensors"]
    assert sorted(entry["conversion_errors"]) == meta["conversion_errors"], (entry["name"], meta["conversion_errors"])
    for k in COUNT_FIELDS:
        assert entry[k] == meta[k], (entry["name"], k, entry[k], meta[k])
    return True


# ------------------------------------------------------------------------------------------------
# Broken layouts
# ------------------------------------------------------------------------------------------------
def break_layout(name: str, per_expert: dict[str, torch.Tensor]) -> tuple[dict, str]:
    t = dict(per_expert)
    base = "model.language_model.layers.1.mlp.experts"
    E, I = MOE_TEXT_CONFIG["num_experts"], MOE_TEXT_CONFIG["moe_intermediate_size"]
    if name == "missing-expert":
        for p in ("gate_proj", "up_proj", "down_proj"):
            del t[f"{base}.{E - 1}.{p}.weight"]
        what = f"layer 1: expert {E - 1} (the last) absent entirely: {E - 1} experts on disk"
    elif name == "missing-projection":
        del t[f"{base}.5.up_proj.weight"]
        what = "layer 1: expert 5 has gate_proj and down_proj but no up_proj"
    elif name == "index-gap":
        for p in ("gate_proj", "up_proj", "down_proj"):
            t[f"{base}.{E}.{p}.weight"] = t.pop(f"{base}.5.{p}.weight")
        what = f"layer 1: expert 5 absent and an expert {E} present ({E} experts on disk, indices 0-4, 6-{E}); " \
               f"expert {E} holds the original expert 5's weights"
    elif name == "unequal-shapes":
        half = I // 2
        for p in ("gate_proj", "up_proj"):
            t[f"{base}.5.{p}.weight"] = t[f"{base}.5.{p}.weight"][:half].clone()
        t[f"{base}.5.down_proj.weight"] = t[f"{base}.5.down_proj.weight"][:, :half].clone()
        what = f"layer 1: expert 5's projections have intermediate size {half} instead of {I} " \
               f"(gate/up [{half}, H], down [H, {half}])"
    else:
        raise ValueError(name)
    return t, what


ERROR_LAYOUTS = ["missing-expert", "missing-projection", "index-gap", "unequal-shapes"]


def make_error_layout(name: str, per_expert: dict, config_json: dict) -> dict:
    rel = f"{MOE_REL}/errors/{name}"
    out = REPO / rel
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    tensors, what = break_layout(name, per_expert)
    (out / "config.json").write_text(json.dumps(config_json, indent=2, sort_keys=True) + "\n")
    specs = [(n, {torch.bfloat16: "BF16", torch.float32: "F32"}[t.dtype], list(t.shape))
             for n, t in sorted(tensors.items())]
    mf.write_json(out / "tensors.json", {
        "source": f"tools/make_moe_fixtures.py: the per-expert tiny layout, broken: {what}",
        "tensors": [{"name": n, "dtype": d, "shape": s} for n, d, s in specs]})
    report = {"tool_version": f"transformers {transformers.__version__}",
              "torch_version": torch.__version__.split("+")[0],
              "layout": name, "broken": what, "base_layout": "per-expert",
              "load_arguments": "from_pretrained(tmp_checkpoint, output_loading_info=True, "
                                "attn_implementation='eager')  # dtype 'auto'; the checkpoint is written to a "
                                "temporary directory from these headers and the per-expert fixture's values",
              "checkpoint_tensors": len(specs), "paths": []}
    with tempfile.TemporaryDirectory() as d:
        write_checkpoint(Path(d), tensors, config_json)
        config_obj = AutoConfig.from_pretrained(d)
        for path_name, auto_name, auto_cls in PATHS:
            model, info, records, routes, err = load_recorded(auto_cls, d, attn_implementation="eager")
            meta = meta_counts(auto_cls, config_obj, specs)
            with torch.device("meta"):
                model_keys = set(auto_cls.from_config(config_obj).state_dict())
            entry = path_report(path_name, auto_name, model, info, records, routes, err, [n for n, _, _ in specs],
                                model_keys)
            entry["meta_counts_equal"] = compare_meta(entry, meta)
            if model is not None and name == "index-gap":
                entry["silently_loaded"] = index_gap_facts(model, per_expert)
            report["paths"].append(entry)
            del model
    mf.write_json(out / "load_report.json", report)
    return report


@torch.no_grad()
def index_gap_facts(model, per_expert: dict) -> dict:
    """Which original expert each slot of layer 1 holds after the gap layout loaded without complaint."""
    lm = next(m for m in model.modules() if isinstance(m, mqm.Qwen3_5MoeTextModel))
    gu = lm.layers[1].mlp.experts.gate_up_proj.detach().float()
    I = MOE_TEXT_CONFIG["moe_intermediate_size"]
    base = "model.language_model.layers.1.mlp.experts"
    slots = []
    for s in range(gu.shape[0]):
        match = [e for e in range(MOE_TEXT_CONFIG["num_experts"])
                 if torch.equal(gu[s, :I], per_expert[f"{base}.{e}.gate_proj.weight"].float())]
        slots.append(match[0] if match else None)
    return {"slot_holds_original_expert": slots,
            "note": "stacked in dot_natural_key order of the indices on disk (0-4, 6-8): checkpoint expert 8 "
                    "(original expert 5) lands in slot 7, experts 6 and 7 move down one slot; no warning, "
                    "no missing or mismatched key"}


# ------------------------------------------------------------------------------------------------
# torch.topk on CPU: the tie rule
# ------------------------------------------------------------------------------------------------
def _comp(x, y):
    """TopKImpl.h's comparator for largest=True: NaN first, then greater values; indices never compared."""
    return (math.isnan(x[0]) and not math.isnan(y[0])) or x[0] > y[0]


def _lg(n):
    return n.bit_length() - 1


def _push_heap(a, f, hole, top, val):
    parent = (hole - 1) // 2
    while hole > top and _comp(a[f + parent], val):
        a[f + hole] = a[f + parent]
        hole = parent
        parent = (hole - 1) // 2
    a[f + hole] = val


def _adjust_heap(a, f, hole, ln, val):
    top, sc = hole, hole
    while sc < (ln - 1) // 2:
        sc = 2 * (sc + 1)
        if _comp(a[f + sc], a[f + sc - 1]):
            sc -= 1
        a[f + hole] = a[f + sc]
        hole = sc
    if (ln & 1) == 0 and sc == (ln - 2) // 2:
        sc = 2 * (sc + 1)
        a[f + hole] = a[f + sc - 1]
        hole = sc - 1
    _push_heap(a, f, hole, top, val)


def _make_heap(a, f, l):
    ln = l - f
    if ln < 2:
        return
    parent = (ln - 2) // 2
    while True:
        _adjust_heap(a, f, parent, ln, a[f + parent])
        if parent == 0:
            return
        parent -= 1


def _pop_heap(a, f, l, res):
    val = a[res]
    a[res] = a[f]
    _adjust_heap(a, f, 0, l - f, val)


def _heap_select(a, f, m, l):
    _make_heap(a, f, m)
    for i in range(m, l):
        if _comp(a[i], a[f]):
            _pop_heap(a, f, m, i)


def _partial_sort(a, f, m, l):
    _heap_select(a, f, m, l)
    while m - f > 1:
        m -= 1
        _pop_heap(a, f, m, m)


def _move_median_to_first(a, r, x, y, z):
    def sw(i, j):
        a[i], a[j] = a[j], a[i]
    if _comp(a[x], a[y]):
        if _comp(a[y], a[z]):
            sw(r, y)
        elif _comp(a[x], a[z]):
            sw(r, z)
        else:
            sw(r, x)
    elif _comp(a[x], a[z]):
        sw(r, x)
    elif _comp(a[y], a[z]):
        sw(r, z)
    else:
        sw(r, y)


def _unguarded_partition(a, f, l, piv):
    while True:
        while _comp(a[f], a[piv]):
            f += 1
        l -= 1
        while _comp(a[piv], a[l]):
            l -= 1
        if not f < l:
            return f
        a[f], a[l] = a[l], a[f]
        f += 1


def _partition_pivot(a, f, l):
    mid = f + (l - f) // 2
    _move_median_to_first(a, f, f + 1, mid, l - 1)
    return _unguarded_partition(a, f + 1, l, f)


def _linear_insert(a, last):
    val = a[last]
    nxt = last - 1
    while _comp(val, a[nxt]):
        a[last] = a[nxt]
        last = nxt
        nxt -= 1
    a[last] = val


def _insertion_sort(a, f, l):
    if f == l:
        return
    for i in range(f + 1, l):
        if _comp(a[i], a[f]):
            val = a[i]
            a[f + 1:i + 1] = a[f:i]
            a[f] = val
        else:
            _linear_insert(a, i)


def _nth_element(a, f, nth, l):
    if f == l or nth == l:
        return
    depth = _lg(l - f) * 2
    while l - f > 3:
        if depth == 0:
            _heap_select(a, f, nth + 1, l)
            a[f], a[nth] = a[nth], a[f]
            return
        depth -= 1
        cut = _partition_pivot(a, f, l)
        if cut <= nth:
            f = cut
        else:
            l = cut
    _insertion_sort(a, f, l)


def _introsort_loop(a, f, l, depth):
    while l - f > 16:
        if depth == 0:
            _partial_sort(a, f, l, l)
            return
        depth -= 1
        cut = _partition_pivot(a, f, l)
        _introsort_loop(a, cut, l, depth)
        l = cut


def _std_sort(a, f, l):
    if f == l:
        return
    _introsort_loop(a, f, l, _lg(l - f) * 2)
    if l - f > 16:
        _insertion_sort(a, f, f + 16)
        for i in range(f + 16, l):
            _linear_insert(a, i)
    else:
        _insertion_sort(a, f, l)


def topk_port(values: list[float], k: int) -> list[int]:
    """``at::native::topk_impl_loop`` (aten/src/ATen/native/TopKImpl.h, largest=True, sorted=True) with
    libstdc++'s algorithms: ``k * 64 <= n`` -> ``std::partial_sort(begin, begin+k, end)``; else
    ``std::nth_element(begin, begin+k-1, end)`` then ``std::sort(begin, begin+k-1)`` (the k-th stays put)."""
    n = len(values)
    a = [(v, j) for j, v in enumerate(values)]
    if k * 64 <= n:
        _partial_sort(a, 0, k, n)
    else:
        _nth_element(a, 0, k - 1, n)
        _std_sort(a, 0, k - 1)
    return [j for _, j in a[:k]]


def tie_golden(out: Path) -> dict:
    mf.setup_determinism()
    rng = random.Random(SEED + 1)
    tensors, facts = {}, {}
    for n, k in TIE_CASES:
        rows = []
        for r in range(TIE_ROWS):
            levels = [1, 2, 3, 5, 16, 200][r % 6]  # all equal, two levels, ..., few ties
            rows.append([rng.randrange(levels) for _ in range(n)])
        vals = torch.tensor(rows, dtype=torch.bfloat16)  # small integers: exact in bf16
        idx = torch.topk(vals.float(), k, dim=-1).indices
        port = [topk_port([float(x) for x in row], k) for row in rows]
        assert idx.tolist() == port, (n, k)
        low_index_first = sum(_lowest_index_rule(row, k) == i for row, i in zip(rows, idx.tolist()))
        tensors[f"n{n}_k{k}.values"] = vals
        tensors[f"n{n}_k{k}.indices"] = idx.to(torch.int64)
        facts[f"n={n} k={k}"] = {
            "rows": TIE_ROWS,
            "algorithm": "partial_sort" if k * 64 <= n else "nth_element + sort(first k-1)",
            "port_matches_torch": TIE_ROWS,
            "rows_where_lowest_index_wins_would_match": low_index_first,
        }
    all_zero = {f"n={n} k={k}": torch.topk(torch.zeros(1, n), k).indices[0].tolist() for n, k in TIE_CASES}
    mf.save_safetensors(out, tensors, {"format": "hsparity.topk_ties.v1",
                                       "tool_version": f"torch {torch.__version__.split('+')[0]}",
                                       "source": "torch.topk(values.float(), k, dim=-1) on CPU"})
    return {"cases": facts, "all_equal_row_indices": all_zero}


def _lowest_index_rule(row, k):
    return sorted(range(len(row)), key=lambda j: (-row[j], j))[:k]


# ------------------------------------------------------------------------------------------------
# One MoE block in isolation
# ------------------------------------------------------------------------------------------------
@torch.no_grad()
def block_golden(out: Path) -> dict:
    mf.setup_determinism()
    gen = torch.Generator().manual_seed(SEED + 2)
    cfg = Qwen3_5MoeTextConfig(**BLOCK_CONFIG)
    cfg._experts_implementation = "grouped_mm"
    blk = mqm.Qwen3_5MoeSparseMoeBlock(cfg).eval()
    H, E, I, S = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size

    def bf(t):
        return t.to(torch.bfloat16).float()

    router = torch.randn(E, H, generator=gen) * (2.0 / H ** 0.5)
    for r in BLOCK_TIED_ROWS[1:]:
        router[r] = router[BLOCK_TIED_ROWS[0]]
    w = {
        "gate.weight": bf(router),
        "experts.gate_up_proj": bf(torch.randn(E, 2 * I, H, generator=gen) / H ** 0.5),
        "experts.down_proj": bf(torch.randn(E, H, I, generator=gen) * (0.5 / I ** 0.5)),
        "shared_expert.gate_proj.weight": bf(torch.randn(S, H, generator=gen) / H ** 0.5),
        "shared_expert.up_proj.weight": bf(torch.randn(S, H, generator=gen) / H ** 0.5),
        "shared_expert.down_proj.weight": bf(torch.randn(H, S, generator=gen) * (0.5 / S ** 0.5)),
        "shared_expert_gate.weight": bf(torch.randn(1, H, generator=gen) / H ** 0.5),
    }
    blk.load_state_dict(w, strict=True)
    h = bf(torch.randn(BLOCK_TOKENS, H, generator=gen))
    tensors = {"hidden_states": h.to(torch.bfloat16)} | {k: v.to(torch.bfloat16) for k, v in w.items()}
    facts = {"config": BLOCK_CONFIG, "tokens": BLOCK_TOKENS, "tied_router_rows": list(BLOCK_TIED_ROWS)}
    assert hf_moe.ALL_EXPERTS_FUNCTIONS["grouped_mm"] is hf_moe.grouped_mm_experts_forward
    for dname, dt in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        b = blk.to(dt)
        x = h.to(dt)[None]
        store = []
        hd = b.gate.register_forward_hook(lambda _m, _a, o: store.append(o))
        ex_store = []
        he = b.experts.register_forward_hook(lambda _m, _a, o: ex_store.append(o))
        y = b(x)[0]
        hd.remove()
        he.remove()
        logits, scores, idx = store[0]
        shared = F.sigmoid(b.shared_expert_gate(x[0])) * b.shared_expert(x[0])
        assert torch.equal((ex_store[0] + shared).reshape(y.shape), y), "block = experts + gated shared"
        # the notes' router order, recomputed with plain torch ops: bitwise equal
        ref = reference_router(logits, cfg.num_experts_per_tok)
        assert torch.equal(ref[0], idx) and torch.equal(ref[1], scores), dname
        # grouped_mm == one GEMM per expert over its tokens + f32 sum over k (one rounding), bitwise
        manual = manual_grouped(b, x[0], idx, scores)
        cfg._experts_implementation = "eager"
        y_eager = b(x)[0]
        cfg._experts_implementation = "grouped_mm"
        facts[dname] = {
            "router_matches_notes_order_bitwise": True,
            "router_alternatives_weights_differing": router_alternatives(logits, cfg.num_experts_per_tok, scores, idx),
            "grouped_mm_equals_per_expert_gemm_plus_f32_sum": bool(torch.equal(manual, ex_store[0])),
            "grouped_mm_vs_manual_max_abs": float((manual.float() - ex_store[0].float()).abs().max()),
            "grouped_mm_vs_eager_output_max_abs": float((y.float() - y_eager.float()).abs().max()),
            "grouped_mm_vs_eager_elements_differing": int((y != y_eager).sum()),
            "tokens_with_tied_experts_in_top_k": int(sum(len(set(r.tolist()) & set(BLOCK_TIED_ROWS)) > 0
                                                         for r in idx)),
            "can_use_native_grouped_mm_on_cpu": bool(hf_moe._can_use_grouped_mm(
                x[0], b.experts.gate_up_proj.transpose(-2, -1), torch.zeros(E, dtype=torch.int32))),
        }
        p_model = torch.softmax(logits, dim=-1)  # the router-dtype suspect: softmax in the model dtype
        v_m, i_m = torch.topk(p_model, cfg.num_experts_per_tok, dim=-1)
        w_m = (v_m / v_m.sum(dim=-1, keepdim=True)).to(logits.dtype)
        tensors |= {
            f"{dname}.router_model_dtype.topk_indices": i_m.to(torch.int64).contiguous(),
            f"{dname}.router_model_dtype.routing_weights": w_m.float().contiguous(),
            f"{dname}.router_logits": logits.float().contiguous(),
            f"{dname}.topk_indices": idx.to(torch.int64).contiguous(),
            f"{dname}.routing_weights": scores.float().contiguous(),
            f"{dname}.experts_output": ex_store[0].float().contiguous(),
            f"{dname}.shared_output": shared.float().contiguous(),
            f"{dname}.output": y.float().contiguous(),
            f"{dname}.output_eager": y_eager.float().contiguous(),
        }
    mf.save_safetensors(out, tensors, {
        "format": "hsparity.moe_block.v1", "tool_version": f"transformers {transformers.__version__}",
        "source": "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeSparseMoeBlock, "
                  "experts_implementation grouped_mm (output_eager: eager)",
        "hidden_size": str(H), "num_experts": str(E), "top_k": str(cfg.num_experts_per_tok),
        "moe_intermediate_size": str(I), "shared_expert_intermediate_size": str(S), "tokens": str(BLOCK_TOKENS)})
    return facts


def reference_router(logits, k):
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    v, i = torch.topk(probs, k, dim=-1)
    v = v / v.sum(dim=-1, keepdim=True)
    return i, v.to(logits.dtype)


def router_alternatives(logits, k, scores, idx) -> dict:
    """How many routing weights (or index slots) differ from transformers' when the order is changed."""
    def count(v, i=None):
        d = {"weights_differing": int((v.float() != scores.float()).sum())}
        if i is not None:
            d["index_slots_differing"] = int((i != idx).sum())
        return d

    out = {}
    p_model = torch.softmax(logits, dim=-1)  # softmax in the model dtype
    v, i = torch.topk(p_model, k, dim=-1)
    out["softmax_in_model_dtype"] = count((v / v.sum(-1, keepdim=True)).to(logits.dtype), i)
    p = torch.softmax(logits, dim=-1, dtype=torch.float32)
    v, i = torch.topk(p, k, dim=-1)
    out["no_renormalisation"] = count(v.to(logits.dtype), i)
    vc = v.to(logits.dtype)
    out["cast_before_renormalising"] = count(vc / vc.sum(-1, keepdim=True))
    v2, i2 = torch.topk(logits.float(), k, dim=-1)
    out["topk_on_logits_instead_of_probs"] = {"index_slots_differing": int((i2 != idx).sum())}
    return out


def manual_grouped(b, x, idx, scores):
    """Per expert: one GEMM over the tokens routed to it (torch.mm in the block dtype), silu(gate) * up, down
    GEMM, times the routing weight; then the k outputs of each token summed by ``.sum(dim=1)`` (f32
    accumulation for bf16, one rounding) in top-k slot order."""
    T, k = idx.shape
    I = b.experts.intermediate_dim
    outk = torch.zeros(T, k, x.shape[-1], dtype=x.dtype)
    for e in range(b.experts.num_experts):
        tok, slot = torch.where(idx == e)
        if tok.numel() == 0:
            continue
        gu = torch.mm(x[tok], b.experts.gate_up_proj[e].t())
        hmid = F.silu(gu[:, :I]) * gu[:, I:]
        o = torch.mm(hmid, b.experts.down_proj[e].t())
        outk[tok, slot] = o * scores[tok, slot, None]
    return outk.sum(dim=1).to(x.dtype)


# ------------------------------------------------------------------------------------------------
# Qwen3.5-35B-A3B: published layout, derived layouts, counts on the meta device
# ------------------------------------------------------------------------------------------------
LAYOUT_RULES = {
    "qwen3.5-fused": "tensors.json as published (fused main experts, per-expert MTP experts)",
    "qwen3.6-fused": "tensors.json with the 3E MTP expert keys mtp.layers.0.mlp.experts.{e}.{gate,up,down}_proj.weight "
                     "replaced by mtp.layers.0.mlp.experts.gate_up_proj [E, 2I, H] and .down_proj [E, H, I] "
                     "(same dtype), placed where expert 0's gate_proj was",
    "per-expert": "tensors.json with every main model.language_model.layers.{i}.mlp.experts.gate_up_proj "
                  "[E, 2I, H] replaced (in place) by, for e in 0..E, ...experts.{e}.gate_proj.weight [I, H] and "
                  "...experts.{e}.up_proj.weight [I, H], and every ...experts.down_proj [E, H, I] by "
                  "...experts.{e}.down_proj.weight [H, I] (same dtype)",
}


def derive_35b_layout(specs: list, layout: str) -> list:
    if layout == "qwen3.5-fused":
        return list(specs)
    out = []
    if layout == "qwen3.6-fused":
        per = [s for s in specs if s[0].startswith("mtp.") and ".mlp.experts." in s[0]
               and s[0].split(".")[-3].isdigit()]
        g0 = next(s for s in per if s[0].endswith("experts.0.gate_proj.weight"))
        E = len(per) // 3
        I, H = g0[2]
        for s in specs:
            if s in per:
                if s is g0:
                    base = s[0][: -len("0.gate_proj.weight")]
                    out.append((base + "gate_up_proj", s[1], [E, 2 * I, H]))
                    out.append((base + "down_proj", s[1], [E, H, I]))
                continue
            out.append(s)
        return out
    if layout == "per-expert":
        for n, d, shape in specs:
            if n.startswith("model.language_model.") and n.endswith("mlp.experts.gate_up_proj"):
                base = n[: -len("gate_up_proj")]
                E, I2, H = shape
                for e in range(E):
                    out.append((f"{base}{e}.gate_proj.weight", d, [I2 // 2, H]))
                    out.append((f"{base}{e}.up_proj.weight", d, [I2 // 2, H]))
            elif n.startswith("model.language_model.") and n.endswith("mlp.experts.down_proj"):
                base = n[: -len("down_proj")]
                E, H, I = shape
                for e in range(E):
                    out.append((f"{base}{e}.down_proj.weight", d, [H, I]))
            else:
                out.append((n, d, shape))
        return out
    raise ValueError(layout)


def make_35b() -> dict | None:
    dst = REPO / A35_REL
    if not (dst / "tensors.json").exists():
        log("fixtures/qwen3.5-35b-a3b/tensors.json not found; expected_counts.json not regenerated")
        return None
    cfg = AutoConfig.from_pretrained(str(dst))
    t = json.loads((dst / "tensors.json").read_text())
    specs = [(e["name"], e["dtype"], e["shape"]) for e in t["tensors"]]
    result = {"tool_version": f"transformers {transformers.__version__}",
              "torch_version": torch.__version__.split("+")[0],
              "method": "tools/make_moe_fixtures.py meta_counts: AutoModelFor*.from_config(config) under "
                        "torch.device('meta'), get_model_conversion_mapping, convert_and_load_state_dict_in_model "
                        "on meta tensors of the listed shapes/dtypes (device_map {'': 'meta'}) with "
                        "core_model_loading.rename_source_key recorded, then _adjust_missing_and_unexpected_keys",
              "fields": {
                  "checkpoint_keys_consumed": "checkpoint keys that went into a model parameter (incl. converted)",
                  "checkpoint_keys_converted": "of those, keys that went through a WeightConverter (fused)",
                  "checkpoint_keys_converted_then_dropped": "keys a WeightConverter renamed onto a name the model "
                                                            "does not have, then dropped by an ignore rule or "
                                                            "reported UNEXPECTED",
                  "checkpoint_keys_dropped_by_rule": "keys not loaded and not reported "
                                                     "(_keys_to_ignore_on_load_unexpected)",
                  "checkpoint_keys_unexpected": "keys not loaded whose (renamed) name is reported UNEXPECTED",
                  "parameters_converted": "model parameters produced by a WeightConverter",
                  "missing_keys": "model parameters without checkpoint data (reported MISSING)"},
              "layouts": {}}
    for layout in LAYOUTS:
        lspecs = derive_35b_layout(specs, layout)
        entry = {"rule": LAYOUT_RULES[layout], "checkpoint_tensors": len(lspecs),
                 "checkpoint_params": sum(math.prod(s) for _, _, s in lspecs), "paths": {}}
        for path_name, auto_name, auto_cls in PATHS:
            m = meta_counts(auto_cls, cfg, lspecs)
            m["auto_class"] = auto_name
            assert m["checkpoint_keys_consumed"] + m["checkpoint_keys_dropped_by_rule"] + \
                m["checkpoint_keys_unexpected"] == len(lspecs)
            entry["paths"][path_name] = m
        result["layouts"][layout] = entry
    mf.write_json(dst / "expected_counts.json", result)
    return result


# ------------------------------------------------------------------------------------------------
# A dtype divergence on the MoE family, and a random-weight DFlash drafter
# ------------------------------------------------------------------------------------------------
FP16_DISK_REL = f"{MOE_REL}/divergence/fp16-disk"
DRAFTER_REL = f"{MOE_REL}/drafter-random"
DRAFTER_TAPS = [1, 3]  # decoder layers; 3 is the last, so the normed-last-tap suspect applies


def make_fp16_disk(fused_main: dict, mtp: dict, config_json: dict, prompts, prompts_ids, tok_src: Path) -> dict:
    """The Qwen3.5 layout with its BF16 weights stored as F16 (F32 tensors kept), the published config
    (``text_config.dtype = "bfloat16"``, no top-level ``dtype``): ``causal-lm`` loads bf16 (text_config.dtype),
    the VLM classes f16 (the first weight on disk). Goldens per class in the dtype it loads with, and the
    routers' top-k agreement between the paths per layer: the MoE way two paths part."""
    ckpt = REPO / FP16_DISK_REL
    shutil.rmtree(ckpt, ignore_errors=True)
    (ckpt / "golden").mkdir(parents=True)
    tensors = {k: (v if v.dtype == torch.float32 else v.to(torch.float16).contiguous())
               for k, v in layout_tensors(fused_main, mtp, "qwen3.5-fused").items()}
    write_checkpoint(ckpt, tensors, config_json)
    for fname in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tok_src / fname, ckpt / fname)
    with open(ckpt / "prompts.jsonl", "w") as f:
        for p in prompts:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    report = {"tool_version": f"transformers {transformers.__version__}",
              "torch_version": torch.__version__.split("+")[0],
              "checkpoint": FP16_DISK_REL,
              "describes": "qwen3.5-fused with BF16 weights stored as F16 (A_log, linear_attn.norm F32); "
                           "text_config.dtype bfloat16, no top-level dtype",
              "load_arguments": "from_pretrained(checkpoint, attn_implementation='eager')  # dtype 'auto'",
              "prompt_token_counts": [len(p) for p in prompts_ids], "paths": []}
    goldens = {}
    for path_name, auto_name, auto_cls in PATHS:
        model, _, _, _, err = load_recorded(auto_cls, FP16_DISK_REL, attn_implementation="eager")
        assert err is None, (path_name, err)
        dts = {p.dtype for p in model.parameters()}
        assert len(dts) == 1, dts
        dname = {torch.bfloat16: "bf16", torch.float16: "f16"}[dts.pop()]
        t = golden_dump(model, prompts_ids, path_name, FP16_DISK_REL, dname)
        goldens[path_name] = t
        mf.save_safetensors(ckpt / "golden" / f"{path_name}.safetensors", t,
                            golden_metadata(model, path_name, FP16_DISK_REL, dname))
        report["paths"].append({"name": path_name, "auto_class": auto_name, "class": type(model).__name__,
                                "dtype": dname})
        del model
    assert [p["dtype"] for p in report["paths"]] == ["bf16", "f16", "f16"], report["paths"]
    report["router_agreement_vs_causal_lm"] = {
        other: routing_agreement(goldens["causal-lm"], goldens[other], len(prompts_ids))
        for other in ("vlm", "image-text-to-text")}
    mf.write_json(ckpt / "golden" / "load_report.json", report)
    return report


@torch.no_grad()
def make_text_only() -> dict:
    """A text-only ``qwen3_5_moe_text`` checkpoint as ``Qwen3_5MoeForCausalLM.save_pretrained`` writes it for a
    model built from the tiny text config (random weights, bf16), headers only (``config.json``,
    ``tensors.json``), and what each Auto class does with it (``load_report.json``; the image-text-to-text
    class has no mapping for this config and raises)."""
    out = REPO / f"{MOE_REL}/text-only"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    mf.setup_determinism()
    torch.manual_seed(SEED + 11)
    model = AutoModelForCausalLM.from_config(moe_config().text_config).to(torch.bfloat16)
    report = {"tool_version": f"transformers {transformers.__version__}",
              "torch_version": torch.__version__.split("+")[0],
              "describes": "Qwen3_5MoeForCausalLM(tiny text config).save_pretrained, loaded by each Auto class "
                           "(dtype 'auto', eager)", "paths": []}
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        del model
        config_json = json.loads((Path(d) / "config.json").read_text())
        (out / "config.json").write_text(json.dumps(config_json, indent=2, sort_keys=True) + "\n")
        specs = sorted(checkpoint_specs_any(Path(d)))
        mf.write_json(out / "tensors.json", {
            "source": "tools/make_moe_fixtures.py: Qwen3_5MoeForCausalLM.save_pretrained of the tiny text config",
            "tensors": [{"name": n, "dtype": t, "shape": sh} for n, t, sh in specs]})
        report["checkpoint_tensors"] = len(specs)
        for path_name, auto_name, auto_cls in PATHS:
            model, info, records, routes, err = load_recorded(auto_cls, d, attn_implementation="eager")
            if model is None and info is None:
                report["paths"].append({"name": path_name, "auto_class": auto_name, "loaded": False,
                                        "error_type": type(err).__name__,
                                        "error": mf._ANSI.sub("", str(err)).strip().splitlines()[0]})
                continue
            report["paths"].append(path_report(path_name, auto_name, model, info, records, routes, err,
                                               [n for n, _, _ in specs]))
            del model
    assert [p["loaded"] for p in report["paths"]] == [True, True, False], report["paths"]
    mf.write_json(out / "load_report.json", report)
    return report


def make_random_drafter() -> dict:
    """A DFlash drafter for the tiny MoE target with random weights (N(0, 0.02), norms zero-centred at 1):
    it exercises ``drafter``, ``compare --drafter`` and ``triage`` on an MoE target; its tau means nothing."""
    out = REPO / DRAFTER_REL
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    tc = MOE_TEXT_CONFIG
    H, V, heads, kv, hd, inter = tc["hidden_size"], tc["vocab_size"], 2, 1, 16, 48
    cfg = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "dtype": "bfloat16",
           "block_size": 8, "dflash_config": {"block_size": 8, "mask_token_id": 1,
                                              "target_layer_ids": DRAFTER_TAPS},
           "hidden_size": H, "intermediate_size": inter, "num_hidden_layers": 1, "num_attention_heads": heads,
           "num_key_value_heads": kv, "head_dim": hd, "hidden_act": "silu", "rms_norm_eps": 1e-6,
           "max_position_embeddings": tc["max_position_embeddings"], "vocab_size": V,
           "num_target_layers": tc["num_hidden_layers"], "layer_types": ["full_attention"],
           "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "tie_word_embeddings": False,
           "attention_bias": False, "use_sliding_window": False}
    gen = torch.Generator().manual_seed(SEED + 7)

    def w(*shape):
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16)

    K = len(DRAFTER_TAPS)
    t = {"fc.weight": w(H, K * H), "hidden_norm.weight": ones(H), "norm.weight": ones(H)}
    p = "layers.0."
    t |= {p + "input_layernorm.weight": ones(H), p + "post_attention_layernorm.weight": ones(H),
          p + "self_attn.q_proj.weight": w(heads * hd, H), p + "self_attn.k_proj.weight": w(kv * hd, H),
          p + "self_attn.v_proj.weight": w(kv * hd, H), p + "self_attn.o_proj.weight": w(H, heads * hd),
          p + "self_attn.q_norm.weight": ones(hd), p + "self_attn.k_norm.weight": ones(hd),
          p + "mlp.gate_proj.weight": w(inter, H), p + "mlp.up_proj.weight": w(inter, H),
          p + "mlp.down_proj.weight": w(H, inter)}
    mf.save_safetensors(out / "model.safetensors", t, {"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return {"taps": DRAFTER_TAPS, "tensors": len(t)}


# ------------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------------
def main():
    os.chdir(REPO)
    if transformers.__version__ != EXPECTED_TRANSFORMERS:
        sys.exit(f"need transformers {EXPECTED_TRANSFORMERS}, have {transformers.__version__}")
    transformers.logging.set_verbosity_warning()
    transformers.logging.disable_progress_bar()
    transformers.logging.disable_default_handler()  # the LOAD REPORTs are recorded, not printed
    mf.setup_determinism()
    tok_src = REPO / mf.CKPT_REL
    if not (tok_src / "tokenizer.json").exists():
        sys.exit(f"{tok_src}/tokenizer.json missing: run tools/make_fixtures.py first")
    root = REPO / MOE_REL
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)

    # prompts
    tok = Tokenizer.from_file(str(tok_src / "tokenizer.json"))
    prompts = [{"text": mf.DIV_PROMPT_SHORT}, {"text": PROMPT_P1}]
    prompts_ids = [mf.encode(tok, p["text"]) for p in prompts]
    assert 8 <= len(prompts_ids[0]) <= 14 and 20 <= len(prompts_ids[1]) <= 30, [len(x) for x in prompts_ids]

    # weights (the same in every layout)
    mf.setup_determinism()
    gen = torch.Generator().manual_seed(SEED)
    config = moe_config()
    model = Qwen3_5MoeForConditionalGeneration(config).eval().float()
    randomise_moe(model, gen)
    fused_main = {k: disk_dtype(k, v) for k, v in model.state_dict().items()}
    mtp = {k: disk_dtype(k, v) for k, v in mtp_tensors(gen).items()}
    config_json = published_like_config(model.config)
    # what save_pretrained writes for a from_config model: the per-expert layout's main keys
    with tempfile.TemporaryDirectory() as d:
        model.to(torch.bfloat16).save_pretrained(d)
        from_config_keys = sorted(n for n, _, _ in checkpoint_specs_any(Path(d)))
    per_expert_main = sorted(unfuse(fused_main, "model.language_model.").keys())
    assert from_config_keys == per_expert_main, "save_pretrained of a from_config model must write per-expert keys"
    del model

    reports, layout_goldens = {}, {}
    for layout in LAYOUTS:
        tensors = layout_tensors(fused_main, mtp, layout)
        reports[layout], layout_goldens[layout] = make_layout(layout, tensors, config_json, prompts, prompts_ids,
                                                              tok_src)
    ref = layout_goldens[LAYOUTS[0]]
    for layout in LAYOUTS[1:]:
        for key, t in layout_goldens[layout].items():
            for name, v in t.items():
                assert torch.equal(v, ref[key][name]), (layout, key, name)
    check_layout_facts(reports)

    fp16 = make_fp16_disk(fused_main, mtp, config_json, prompts, prompts_ids, tok_src)
    log("== divergence/fp16-disk: " + json.dumps(fp16["router_agreement_vs_causal_lm"]))
    make_random_drafter()
    text_only = make_text_only()
    log("== text-only: " + json.dumps([(p["name"], p.get("class"), p.get("state_dict_tensors"))
                                       for p in text_only["paths"]]))

    per_expert = layout_tensors(fused_main, mtp, "per-expert")
    error_reports = {n: make_error_layout(n, per_expert, config_json) for n in ERROR_LAYOUTS}
    check_error_facts(error_reports)

    (root / "block").mkdir()
    ties = tie_golden(root / "block" / "topk_ties.safetensors")
    block = block_golden(root / "block" / "moe_block.safetensors")
    facts = {
        "tool_version": f"transformers {transformers.__version__}",
        "torch_version": torch.__version__.split("+")[0],
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "topk_tie_rule": {
            "rule": "torch.topk on CPU (aten/src/ATen/native/TopKImpl.h topk_impl_loop, largest=True, sorted=True) "
                    "pairs (value, index) and compares values only (NaN largest): k*64 <= n -> "
                    "std::partial_sort(first k); else std::nth_element(k-1) then std::sort(first k-1). With "
                    "libstdc++ these are deterministic but not stable: tied experts come out in an order that "
                    "depends on n, k and every value of the row, not 'lowest index first'. A port of libstdc++'s "
                    "algorithms reproduces torch on every tie row (topk_ties.safetensors).",
            **ties,
        },
        "moe_block": block,
    }
    mf.write_json(root / "block" / "facts.json", facts)

    counts = make_35b()
    summary(reports, error_reports, facts, counts)


def checkpoint_specs_any(d: Path):
    specs = []
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), "pt") as fh:
            for k in fh.keys():
                sl = fh.get_slice(k)
                specs.append((k, sl.get_dtype(), list(sl.get_shape())))
    return specs


def check_layout_facts(reports: dict):
    E, L = MOE_TEXT_CONFIG["num_experts"], MOE_TEXT_CONFIG["num_hidden_layers"]
    for layout, rep in reports.items():
        by = {p["name"]: p for p in rep["paths"]}
        for p in by.values():
            assert p["missing_keys"] == [] and p["mismatched_keys"] == [], (layout, p["name"])
            assert p["dtype"] == "bfloat16", (layout, p["name"], p["dtype"])
            assert p["experts_implementation"] == "grouped_mm"
        assert by["vlm"]["unexpected_keys"] == ["lm_head.weight"], by["vlm"]["unexpected_keys"]
        assert by["causal-lm"]["unexpected_keys"] == [] and by["image-text-to-text"]["unexpected_keys"] == []
        main_converted = L * 3 * E if layout == "per-expert" else 0
        mtp_converted = 3 * E if layout != "qwen3.6-fused" else 0
        for name in ("vlm", "image-text-to-text"):
            assert by[name]["checkpoint_keys_converted"] == main_converted, (layout, name)
            assert by[name]["checkpoint_keys_converted_then_dropped"] == 0, (layout, name)
            assert by[name]["parameters_converted"] == (2 * L if main_converted else 0)
        assert by["causal-lm"]["checkpoint_keys_converted"] == main_converted, layout
        # the unscoped causal-lm conversion also fires on the per-expert mtp keys, which are then dropped
        assert by["causal-lm"]["checkpoint_keys_converted_then_dropped"] == mtp_converted, layout
        for p in by.values():
            for fp in p["fused_parameters"]:
                n = len(fp["sources"])
                assert n == (2 * E if fp["parameter"].endswith("gate_up_proj") else E), fp


def check_error_facts(reps: dict):
    def by(name):
        return {p["name"]: p for p in reps[name]["paths"]}

    for name in ("missing-expert",):
        for p in by(name).values():
            assert not p["loaded"] and "ignore_mismatched_sizes" in p["error"], (name, p["name"], p.get("error"))
    for name in ("missing-projection", "unequal-shapes"):
        for p in by(name).values():
            assert not p["loaded"] and "conversion of the weights" in p["error"], (name, p["name"], p.get("error"))
    for p in by("index-gap").values():
        assert p["loaded"] and p["missing_keys"] == [] and p["mismatched_keys"] == []
        assert p["silently_loaded"]["slot_holds_original_expert"] == [0, 1, 2, 3, 4, 6, 7, 5], p["silently_loaded"]


def summary(reports, error_reports, facts, counts):
    log("== fixtures/moe layouts (dtype 'auto', eager)")
    log(f"  {'layout':14s} {'path':19s} {'class':36s} {'dtype':9s} {'sd':>4s} {'cons':>5s} {'conv':>5s} "
        f"{'c->drop':>7s} {'drop':>5s} {'unexp':>5s} params_converted")
    for layout, rep in reports.items():
        for p in rep["paths"]:
            log(f"  {layout:14s} {p['name']:19s} {p['class']:36s} {p['dtype']:9s} {p['state_dict_tensors']:4d} "
                f"{p['checkpoint_keys_consumed']:5d} {p['checkpoint_keys_converted']:5d} "
                f"{p['checkpoint_keys_converted_then_dropped']:7d} {p['checkpoint_keys_dropped_by_rule']:5d} "
                f"{p['checkpoint_keys_unexpected']:5d} {p['parameters_converted']}")
        log(f"  {layout:14s} router f32 vs bf16: {json.dumps(rep['golden_router_choices_f32_vs_bf16'])}")
    log("== broken layouts")
    for name, rep in error_reports.items():
        for p in rep["paths"]:
            if p["loaded"]:
                log(f"  {name:19s} {p['name']:19s} LOADED silently: {p.get('silently_loaded', {}).get('slot_holds_original_expert')}")
            else:
                log(f"  {name:19s} {p['name']:19s} {p['error_type']}: {p['error'].splitlines()[-1][:110]}")
    log("== facts")
    log(json.dumps(facts["moe_block"], indent=1)[:3000])
    log(json.dumps(facts["topk_tie_rule"]["all_equal_row_indices"]))
    if counts:
        log("== Qwen3.5-35B-A3B counts (meta device)")
        for layout, e in counts["layouts"].items():
            for path, m in e["paths"].items():
                log(f"  {layout:14s} {path:19s} tensors={e['checkpoint_tensors']:6d} sd={m['state_dict_tensors']:5d} "
                    f"consumed={m['checkpoint_keys_consumed']:6d} converted={m['checkpoint_keys_converted']:6d} "
                    f"conv->drop={m['checkpoint_keys_converted_then_dropped']:4d} "
                    f"dropped={m['checkpoint_keys_dropped_by_rule']:5d} unexpected={m['checkpoint_keys_unexpected']} "
                    f"missing={len(m['missing_keys'])} params_conv={m['parameters_converted']}")
    log("files:")
    total = 0
    for base in (REPO / MOE_REL, REPO / A35_REL):
        for f in sorted(base.rglob("*")):
            if f.is_file():
                total += f.stat().st_size
                log(f"  {f.relative_to(REPO)}  {f.stat().st_size}  {hashlib.sha256(f.read_bytes()).hexdigest()[:16]}")
    for layout in LAYOUTS + ["errors", "block", "divergence", "drafter-random", "text-only"]:
        d = REPO / MOE_REL / layout
        log(f"  {d.relative_to(REPO)}: {sum(f.stat().st_size for f in d.rglob('*') if f.is_file())} bytes")
    log(f"total: {total} bytes ({total / 2**20:.2f} MiB)")


if __name__ == "__main__":
    main()
