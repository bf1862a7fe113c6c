#!/usr/bin/env python3
"""Capture the inputs and outputs of every operation of transformers' forward, for hsparity's
operation census (``cargo run --release --example op_census``; docs/noise-floor.md, "Which
operation departs first").

    .venv/bin/python tools/op_census.py CHECKPOINT PROMPTS.jsonl OUT.safetensors [--dtype auto]

Runs ``AutoModelForCausalLM.from_pretrained(CHECKPOINT, dtype, attn_implementation="eager")`` on each
prompt (``{"input_ids": [...]}`` lines) with forward hooks on the modules of every decoder layer, and
writes, in the dtype transformers computed in (no cast), for prompt k and module path m relative to
the layer (``layers.{l}.input_layernorm``, ``layers.{l}.linear_attn``, ``layers.{l}.linear_attn.in_proj_qkv``,
``layers.{l}.linear_attn.norm``, ``layers.{l}.self_attn``, ``layers.{l}.self_attn.q_norm``,
``layers.{l}.post_attention_layernorm``, ``layers.{l}.mlp``, ``layers.{l}.mlp.down_proj``, ...):

  p{k}.{m}.in      the module's first input, batch dimension dropped
  p{k}.{m}.gate    the second input of the gated norm (``linear_attn.norm``)
  p{k}.{m}.out     its output
  p{k}.layers.{l}.in / .out   the decoder layer's input and output (hidden_states[l], [l+1])
  p{k}.layers.{l}.linear_attn.delta_rule.{query,key,value,g,beta,out}
                   the arguments ``Qwen3_5GatedDeltaNet.forward`` passes to ``torch_chunk_gated_delta_rule``
                   (after the conv and its SiLU; query and key before the kernel's GVA expansion) and
                   the kernel's output

and ``__metadata__`` {checkpoint, dtype, tool_version}. The census then feeds each captured input to
hsparity's implementation of the same operation and counts the outputs that differ.

Needs transformers 5.23.0 and torch 2.15.0 (tools/requirements.txt).
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

# The modules whose inputs and outputs are captured, by their path inside a decoder layer.
MODULES = ("input_layernorm", "post_attention_layernorm", "linear_attn", "self_attn", "mlp",
           "linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.in_proj_b",
           "linear_attn.in_proj_a", "linear_attn.norm", "linear_attn.out_proj",
           "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def flat(t: torch.Tensor) -> torch.Tensor:
    """[1, T, ...] -> [T, ...], contiguous, on the host."""
    return (t[0] if t.dim() >= 3 and t.shape[0] == 1 else t).detach().cpu().clone().contiguous()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("prompts")
    ap.add_argument("out")
    ap.add_argument("--dtype", default="auto")
    a = ap.parse_args()
    dtype = a.dtype if a.dtype == "auto" else getattr(torch, a.dtype)
    model = AutoModelForCausalLM.from_pretrained(a.checkpoint, dtype=dtype, attn_implementation="eager").eval()
    layers = model.model.layers
    tensors: dict[str, torch.Tensor] = {}
    prompt = {"k": 0}

    def hook(name: str):
        def record(_mod, args, kwargs, out):
            k = prompt["k"]
            tensors[f"p{k}.{name}.in"] = flat(args[0] if args else kwargs["hidden_states"])
            if name.endswith("linear_attn.norm"):
                tensors[f"p{k}.{name}.gate"] = flat(args[1] if len(args) > 1 else kwargs["gate"])
            tensors[f"p{k}.{name}.out"] = flat(out[0] if isinstance(out, tuple) else out)
        return record

    # The delta rule is a module-level function the forward looks up at call time: wrapped here to record
    # its arguments and output, for the layer whose linear_attn is running.
    current = {"layer": None}
    gdn = next(layer.linear_attn for layer in layers if hasattr(layer, "linear_attn"))
    modeling = sys.modules[type(gdn).__module__]  # modeling_qwen3_5 or modeling_qwen3_5_moe
    kernel = modeling.torch_chunk_gated_delta_rule

    def recording_kernel(query, key, value, g, beta, **kw):
        out = kernel(query, key, value, g=g, beta=beta, **kw)
        base = f"p{prompt['k']}.layers.{current['layer']}.linear_attn.delta_rule"
        for name, t in (("query", query), ("key", key), ("value", value), ("g", g), ("beta", beta),
                        ("out", out[0])):
            tensors[f"{base}.{name}"] = flat(t)
        return out

    modeling.torch_chunk_gated_delta_rule = recording_kernel
    for i, layer in enumerate(layers):
        if hasattr(layer, "linear_attn"):
            layer.linear_attn.register_forward_pre_hook(lambda _m, _a, i=i: current.update(layer=i))
        layer.register_forward_hook(hook(f"layers.{i}"), with_kwargs=True)
        for path in MODULES:
            mod = layer
            for part in path.split("."):
                mod = getattr(mod, part, None)
                if mod is None:
                    break
            if mod is not None:
                mod.register_forward_hook(hook(f"layers.{i}.{path}"), with_kwargs=True)
    with open(a.prompts) as f:
        for k, line in enumerate(f):
            prompt["k"] = k
            ids = torch.tensor(json.loads(line)["input_ids"])[None]
            with torch.no_grad():
                model(input_ids=ids, use_cache=False)
    dt = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}[next(model.parameters()).dtype]
    save_file(tensors, a.out, metadata={"checkpoint": a.checkpoint, "dtype": dt,
                                        "tool_version": f"transformers {transformers.__version__}"})
    print(f"wrote {a.out}: {len(tensors)} tensors, {k + 1} prompts, {dt}")


if __name__ == "__main__":
    main()
