#!/usr/bin/env python3
"""Write an hsparity dump (``hsparity.dump.v1``) for any transformers model.

Run it where the model already runs (the training machine, an eval box) and
compare the file with ``hsparity diff`` against hsparity's own run
(``hsparity dump``) or another machine's dump -- without re-running anything.

    python tools/dump_hidden_states.py MODEL_DIR_OR_ID --auto-class AutoModelForCausalLM \
        --prompts prompts.jsonl --out dump.safetensors [--dtype auto|float32|bfloat16|float16] \
        [--attn eager|sdpa] [--device cpu|cuda]

``prompts.jsonl`` holds one JSON object per line, ``{"text": ...}`` (tokenised
with the model's tokenizer, no special tokens) or ``{"input_ids": [...]}``,
optionally with ``"attention_mask": [...]`` (1 attended, 0 masked; passed to the
forward and recorded, so that ``hsparity diff`` can name pads fed unmasked) --
the same file ``hsparity --prompts`` reads, so both sides see the same ids
(``hsparity diff`` refuses dumps whose ``input_ids`` differ).

The file holds, for prompt k (docs/dump-format.md, hsparity.dump.v1):
  p{k}.input_ids            I64 [T]
  p{k}.attention_mask       I64 [T]      when the prompt line gives one
  p{k}.hidden_states.{i}    F32 [T, H]   i = 0..N, ``output_hidden_states=True``
                                         (0 = embeddings, N = final-normed)
  p{k}.last_layer_output    F32 [T, H]   raw output of the last decoder layer (forward hook)
  p{k}.logits               F32 [T, V]   when the model has an LM head (unless --no-logits)
  p{k}.router.{l}.indices   I64 [T, top_k]  MoE models: decoder layer l's experts in torch.topk order
  p{k}.router.{l}.weights   F32 [T, top_k]  and their routing weights, as the router returns them
                                         (``Qwen3_5MoeTopKRouter.forward``: router_indices, router_scores)
and ``__metadata__`` {format, checkpoint, loading_path, class, dtype, num_layers, tool_version}.

Needs only torch, transformers and safetensors.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
import transformers
from safetensors.torch import save_file

AUTO_TO_PATH = {
    "AutoModelForCausalLM": "causal-lm",
    "AutoModel": "vlm",
    "AutoModelForImageTextToText": "image-text-to-text",
}
SHORT = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


def read_prompts(path: str, tokenizer) -> list[tuple[list[int], list[int] | None]]:
    """(ids, attention mask or None) per line."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            obj = json.loads(line)
            if "input_ids" in obj:
                ids = [int(i) for i in obj["input_ids"]]
            elif "text" in obj:
                if tokenizer is None:
                    sys.exit(f"{path}:{n}: a text prompt needs the model's tokenizer")
                ids = tokenizer(obj["text"], add_special_tokens=False)["input_ids"]
            else:
                sys.exit(f"{path}:{n}: expected {{\"text\": ...}} or {{\"input_ids\": [...]}}")
            mask = obj.get("attention_mask")
            if mask is not None and len(mask) != len(ids):
                sys.exit(f"{path}:{n}: attention_mask has {len(mask)} entries for {len(ids)} tokens")
            out.append((ids, None if mask is None else [int(m) for m in mask]))
    return out


def decoder_layers(model) -> list:
    """The text decoder layers, wherever the class keeps them."""
    for attr in ("model.language_model.layers", "language_model.layers", "model.layers", "layers"):
        obj = model
        try:
            for part in attr.split("."):
                obj = getattr(obj, part)
            return list(obj)
        except AttributeError:
            continue
    raise SystemExit("cannot find the decoder layers of this model")


def routers(layers: list) -> list[tuple[int, torch.nn.Module]]:
    """(layer index, router) of every MoE decoder layer: the ``mlp.gate`` that returns (router_logits,
    router_scores, router_indices), as transformers' ``*TopKRouter`` classes do."""
    out = []
    for i, layer in enumerate(layers):
        gate = getattr(getattr(layer, "mlp", None), "gate", None)
        if gate is not None and type(gate).__name__.endswith("TopKRouter"):
            out.append((i, gate))
    return out


@torch.no_grad()
def dump(model, prompts: list[tuple[list[int], list[int] | None]], with_logits: bool = True) -> dict[str, torch.Tensor]:
    """Runs each prompt (batch 1, no cache) and returns the dump's tensors."""
    layers = decoder_layers(model)
    captured = {}

    def hook(_mod, _args, out):
        captured["last"] = out[0] if isinstance(out, (tuple, list)) else out

    handles = [layers[-1].register_forward_hook(hook)]
    choices: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def router_hook(i):
        def record(_mod, _args, out):
            _logits, scores, indices = out
            choices[i] = (indices.to(torch.int64).cpu().contiguous(), scores.float().cpu().contiguous())
        return record

    handles += [r.register_forward_hook(router_hook(i)) for i, r in routers(layers)]
    device = next(model.parameters()).device
    tensors: dict[str, torch.Tensor] = {}
    try:
        for k, (ids, mask) in enumerate(prompts):
            choices.clear()
            input_ids = torch.tensor(ids, dtype=torch.int64)
            attention_mask = None if mask is None else torch.tensor([mask], dtype=torch.int64).to(device)
            out = model(
                input_ids=input_ids[None].to(device),
                attention_mask=attention_mask,
                output_hidden_states=True,
                use_cache=False,
            )
            tensors[f"p{k}.input_ids"] = input_ids.contiguous()
            if mask is not None:
                tensors[f"p{k}.attention_mask"] = torch.tensor(mask, dtype=torch.int64)
            for i, h in enumerate(out.hidden_states):
                tensors[f"p{k}.hidden_states.{i}"] = h[0].float().cpu().contiguous()
            tensors[f"p{k}.last_layer_output"] = captured["last"][0].float().cpu().contiguous()
            logits = getattr(out, "logits", None)
            if with_logits and logits is not None:
                tensors[f"p{k}.logits"] = logits[0].float().cpu().contiguous()
            for i, (indices, weights) in sorted(choices.items()):
                tensors[f"p{k}.router.{i}.indices"] = indices
                tensors[f"p{k}.router.{i}.weights"] = weights
    finally:
        for h in handles:
            h.remove()
    return tensors


def metadata(model, checkpoint: str, auto_class: str) -> dict[str, str]:
    dtype = next(model.parameters()).dtype
    return {
        "format": "hsparity.dump.v1",
        "checkpoint": checkpoint,
        "loading_path": AUTO_TO_PATH.get(auto_class, auto_class),
        "class": type(model).__name__,
        "dtype": SHORT.get(dtype, str(dtype)),
        "num_layers": str(len(decoder_layers(model))),
        "tool_version": f"transformers {transformers.__version__}",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--auto-class", default="AutoModelForCausalLM", choices=sorted(AUTO_TO_PATH))
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="auto", help="auto (what from_pretrained picks) or a torch dtype name")
    ap.add_argument("--attn", default="eager", help="attn_implementation (hsparity computes eager attention)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--no-logits", action="store_true")
    args = ap.parse_args()
    cls = getattr(transformers, args.auto_class)
    dtype = args.dtype if args.dtype == "auto" else getattr(torch, args.dtype)
    model = cls.from_pretrained(args.model, dtype=dtype, attn_implementation=args.attn).to(args.device).eval()
    try:
        tok = transformers.AutoTokenizer.from_pretrained(args.model)
    except Exception:  # noqa: BLE001 -- ids-only prompt files need no tokenizer
        tok = None
    prompts = read_prompts(args.prompts, tok)
    save_file(dump(model, prompts, not args.no_logits), args.out, metadata=metadata(model, args.model, args.auto_class))
    print(f"wrote {args.out}: {len(prompts)} prompts, {type(model).__name__}, {metadata(model, args.model, args.auto_class)['dtype']}")


if __name__ == "__main__":
    main()
