#!/usr/bin/env python3
"""Build fixtures/diagnosis/: pairs of dumps in which a second run parts
from transformers' own forward in one of the ways public reports describe,
each made with transformers 5.23.0 itself on fixtures/tiny-qwen3_5 (f32,
AutoModelForCausalLM, eager attention). `hsparity diff a.safetensors
b.safetensors` must name where and why the runs part.

Cases (each folder: a.safetensors = the reference, b.safetensors = the run,
facts.json = what the generator did, read by the tests):

  chunk-state-lost   b prefills in chunks of 64 tokens through the model's own
                     cache (`past_key_values`), and the Gated DeltaNet recurrent
                     states are zeroed between chunks (a state lost at a prefill
                     chunk boundary). Rows before 64 agree.
  decode-departs     b prefills the prompt, then feeds the continuation one token
                     at a time through the cache with the linear-attention conv
                     states zeroed after the prefill (a decode step that does not
                     receive the prefill's state). b records p{k}.prompt_length.
  request-leak       b runs the prompts one after another and starts each prompt
                     after the first from the previous prompt's Gated DeltaNet
                     states (a recurrent state not reset between requests).
  pads-unmasked      every prompt is left-padded with 6 pad tokens; a runs with the
                     attention mask (0 on the pads) and records it, b runs the same
                     ids without a mask.
  norm-plus-one      two checkpoints (not dumps): a/ is the model as
                     `save_pretrained` writes it, b/ the same with 1 added to every
                     weight of a zero-centred norm (Qwen3_5RMSNorm computes
                     x * (1 + w)), as a conversion that stored 1 + w would;
                     facts.json lists those tensors. `hsparity diff a b` must name them.
  drafter-extra      the toy pair's DFlash drafter with two tensors its forward never
                     reads (`input_norm.weight`, `fc_norm.weight`), as a drafter trained with
                     an extra norm is saved; facts.json holds what dflash 0.1.0's own loader
                     (`DFlashDraftModel.from_pretrained(..., output_loading_info=True)`) lists
                     as unexpected keys.
  drafter-window     the toy pair's DFlash drafter with one sliding_attention layer and
                     sliding_window 6 but no use_sliding_window (false, the Qwen3Config
                     default), as a config edited without it is saved; golden.safetensors
                     holds DFlashDraftModel.forward (f32) on a 20-row context, as dflash
                     0.1.0 loads that config (Qwen3Config drops the window: the layer is
                     causal with no window) and with use_sliding_window true (window 6);
                     facts.json records what Qwen3Config resolved.
  visual-unprefixed  fixtures/divergence/bf16-auto re-saved with its vision tower under
                     `visual.*` instead of `model.visual.*` (as third-party converters and
                     older VLM layouts store it); golden/load_report.json holds what each
                     Auto class of transformers 5.23.0 reports (class, missing and
                     unexpected keys): transformers adds the base-model prefix key by key,
                     so AutoModelForImageTextToText loads the tower, AutoModelForCausalLM
                     reports it UNEXPECTED (its ignore rule is ^model.visual.*).
  normed-stream      b holds, at every index below N, the output of the layer's input RMSNorm
                     (x / rms(x) * (1 + w), what a hook on input_layernorm or SGLang's dumper
                     name input_layernorm.output.0 gives) instead of the residual stream
                     hidden_states[i] itself; hidden_states[N] and last_layer_output as a's.
  pre-norm-last      b is a's capture with its last state taken from a forward hook
                     on the last decoder layer (the pre-norm output, as vLLM's
                     hidden states and decoder-layer hooks give it) stored as
                     hidden_states[N], and no last_layer_output.

Run from the repository root with the pinned environment (tools/requirements.txt):
    python tools/make_diagnosis_fixtures.py            # every case
    python tools/make_diagnosis_fixtures.py CASE ...   # only these (drafter-extra, drafter-window, ...)
"""
from __future__ import annotations

import json
import os

import sys
from pathlib import Path

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import save_safetensors  # noqa: E402  (deterministic bytes)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "fixtures", "tiny-qwen3_5")
OUT = os.path.join(ROOT, "fixtures", "diagnosis")
CHUNK = 64
PAD = 0


def ids_of(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 380, (n,), generator=g).tolist()


def layers(model):
    return model.model.layers


def linear_layers(model) -> list[int]:
    return [i for i, t in enumerate(model.config.layer_types) if t == "linear_attention"]


@torch.no_grad()
def forward(model, ids, cache=None, mask=None):
    """hidden_states (tuple of [1, T, H]) and the last decoder layer's raw output."""
    got = {}
    h = layers(model)[-1].register_forward_hook(lambda _m, _a, out: got.__setitem__("last", out[0] if isinstance(out, tuple) else out))
    try:
        out = model(
            input_ids=torch.tensor([ids]),
            attention_mask=None if mask is None else torch.tensor([mask]),
            past_key_values=cache,
            use_cache=cache is not None,
            output_hidden_states=True,
        )
    finally:
        h.remove()
    return out, got["last"]


def tensors_of(k: int, ids, hidden, last) -> dict[str, torch.Tensor]:
    t = {f"p{k}.input_ids": torch.tensor(ids, dtype=torch.int64)}
    for i, x in enumerate(hidden):
        t[f"p{k}.hidden_states.{i}"] = x[0].float().contiguous()
    if last is not None:
        t[f"p{k}.last_layer_output"] = last[0].float().contiguous()
    return t


def cat(parts):
    """Concatenates per-chunk (hidden_states, last) along the tokens."""
    hidden = [torch.cat([p[0][i] for p in parts], dim=1) for i in range(len(parts[0][0]))]
    last = torch.cat([p[1] for p in parts], dim=1)
    return hidden, last


def new_cache(model):
    return transformers.DynamicCache(config=model.config)


def zero(cache, which: str, model) -> None:
    for i in linear_layers(model):
        layer = cache.layers[i]
        states = getattr(layer, which)
        for s, t in states.items():
            if t is not None:
                t.zero_()


def meta(model, name: str) -> dict[str, str]:
    return {
        "format": "hsparity.dump.v1",
        "checkpoint": "fixtures/tiny-qwen3_5",
        "loading_path": name,
        "class": type(model).__name__,
        "dtype": "f32",
        "num_layers": str(model.config.num_hidden_layers),
        "tool_version": f"transformers {transformers.__version__} (tools/make_diagnosis_fixtures.py)",
    }


def reference(model, prompts, masks=None):
    t = {}
    for k, ids in enumerate(prompts):
        out, last = forward(model, ids, mask=None if masks is None else masks[k])
        t |= tensors_of(k, ids, out.hidden_states, last)
        if masks is not None:
            t[f"p{k}.attention_mask"] = torch.tensor(masks[k], dtype=torch.int64)
    return t


def chunk_state_lost(model, prompts):
    t = {}
    for k, ids in enumerate(prompts):
        cache, parts = new_cache(model), []
        for s in range(0, len(ids), CHUNK):
            if s > 0:
                zero(cache, "recurrent_states", model)
            out, last = forward(model, ids[s : s + CHUNK], cache=cache)
            parts.append((out.hidden_states, last))
        hidden, last = cat(parts)
        t |= tensors_of(k, ids, hidden, last)
    return t, {"boundary": "prefill_chunk", "chunk": CHUNK, "departs_at": [CHUNK for _ in prompts]}


def decode_departs(model, prompts, prompt_len: int):
    t = {}
    for k, ids in enumerate(prompts):
        cache = new_cache(model)
        out, last = forward(model, ids[:prompt_len], cache=cache)
        parts = [(out.hidden_states, last)]
        zero(cache, "conv_states", model)
        for tok in ids[prompt_len:]:
            out, last = forward(model, [tok], cache=cache)
            parts.append((out.hidden_states, last))
        hidden, last = cat(parts)
        t |= tensors_of(k, ids, hidden, last)
        t[f"p{k}.prompt_length"] = torch.tensor([prompt_len], dtype=torch.int64)
    return t, {"boundary": "prompt_end", "departs_at": [prompt_len for _ in prompts]}


def request_leak(model, prompts):
    t, states = {}, None
    for k, ids in enumerate(prompts):
        out, last, states = with_initial_states(model, ids, states)
        t |= tensors_of(k, ids, out.hidden_states, last)
    return t, {"boundary": "request_boundary", "clean": [0], "departing": list(range(1, len(prompts)))}


def with_initial_states(model, ids, initial):
    """A forward over `ids` from position 0 whose Gated DeltaNet layers start
    from `initial` (layer -> recurrent state; None: zeros, as a fresh request)
    and the final states each layer leaves."""
    finals, saved = {}, {}
    for i in linear_layers(model):
        mod = layers(model)[i].linear_attn
        saved[i] = mod.forward

        def patched(hidden_states, cache_params=None, attention_mask=None, _mod=mod, _i=i, **kw):
            state = _OneState(None if initial is None else initial[_i])
            out = type(_mod).forward(_mod, hidden_states, cache_params=state, attention_mask=attention_mask)
            finals[_i] = state.state
            return out

        mod.forward = patched
    try:
        out, last = forward(model, ids)
    finally:
        for i, f in saved.items():
            layers(model)[i].linear_attn.forward = f
    return out, last, finals


class _OneState:
    """The cache interface GatedDeltaNet.forward reads (modeling_qwen3_5.py,
    Qwen3_5GatedDeltaNet.forward), holding one recurrent state and no conv state."""

    def __init__(self, state):
        self.state = state

    def get_conv_state(self, layer_idx, state_idx=0):
        return None

    def get_recurrent_state(self, layer_idx, state_idx=0):
        return self.state

    def is_recording_past(self, layer_idx):
        return False

    def update_conv_state(self, mixed_qkv, layer_idx, conv_kernel_size):
        return mixed_qkv

    def update_recurrent_state(self, state, layer_idx, state_idx=0):
        self.state = state


def load_model():
    """fixtures/tiny-qwen3_5 as AutoModelForCausalLM, f32, eager attention, seeded, one thread."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    return transformers.AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32, attn_implementation="eager").eval()


@torch.no_grad()
def normed_stream() -> None:
    model = load_model()
    prompts = [ids_of(24, 12), ids_of(30, 13)]
    a = reference(model, prompts)
    b = dict(a)
    n = model.config.num_hidden_layers
    for k in range(len(prompts)):
        for i in range(n):
            x = a[f"p{k}.hidden_states.{i}"]
            b[f"p{k}.hidden_states.{i}"] = layers(model)[i].input_layernorm(x[None])[0].float().contiguous()
    d = os.path.join(OUT, "normed-stream")
    os.makedirs(d, exist_ok=True)
    save_safetensors(Path(d) / "a.safetensors", a, meta(model, "causal-lm"))
    save_safetensors(Path(d) / "b.safetensors", b, meta(model, "causal-lm"))
    facts = {"case": "normed-stream", "transformers": transformers.__version__, "torch": torch.__version__,
             "convention": "normed_stream", "indices": list(range(n)),
             "norm_class": type(layers(model)[0].input_layernorm).__name__}
    with open(os.path.join(d, "facts.json"), "w") as f:
        json.dump(facts, f, indent=1)
        f.write("\n")
    print("normed-stream", facts)


def pre_norm_last(model, prompts):
    t = reference(model, prompts)
    n = model.config.num_hidden_layers
    for k in range(len(prompts)):
        t[f"p{k}.hidden_states.{n}"] = t.pop(f"p{k}.last_layer_output")
    return t, {"convention": "pre_norm_last", "index": n}


def main() -> None:
    model = load_model()
    os.makedirs(OUT, exist_ok=True)

    def write(case, a, b, facts):
        d = os.path.join(OUT, case)
        os.makedirs(d, exist_ok=True)
        save_safetensors(Path(d) / "a.safetensors", a, meta(model, "causal-lm"))
        save_safetensors(Path(d) / "b.safetensors", b, meta(model, "causal-lm"))
        facts = {"case": case, "transformers": transformers.__version__, "torch": torch.__version__} | facts
        with open(os.path.join(d, "facts.json"), "w") as f:
            json.dump(facts, f, indent=1)
            f.write("\n")
        print(case, facts)

    long = [ids_of(80, 1), ids_of(72, 2)]
    write("chunk-state-lost", reference(model, long), *chunk_state_lost(model, long))
    short = [ids_of(24, 3), ids_of(30, 4)]
    write("decode-departs", reference(model, short), *decode_departs(model, short, 16))
    three = [ids_of(20, 5), ids_of(18, 6), ids_of(22, 7)]
    write("request-leak", reference(model, three), *request_leak(model, three))
    padded = [[PAD] * 6 + ids_of(18, 8), [PAD] * 6 + ids_of(14, 9)]
    masks = [[0] * 6 + [1] * (len(p) - 6) for p in padded]
    b = reference(model, padded)
    write("pads-unmasked", reference(model, padded, masks), b, {"boundary": "pad_run", "start": 0, "end": 5, "masked_by": "a"})
    write("pre-norm-last", reference(model, short), *pre_norm_last(model, short))
    norm_plus_one(model)
    drafter_extra()
    drafter_window()
    visual_unprefixed()
    normed_stream()


def visual_unprefixed() -> None:
    import shutil

    from safetensors.torch import load_file

    src = os.path.join(ROOT, "fixtures", "divergence", "bf16-auto")
    d = os.path.join(OUT, "visual-unprefixed")
    os.makedirs(os.path.join(d, "golden"), exist_ok=True)
    for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(src, f), os.path.join(d, f))
    tensors = {
        (k.replace("model.visual.", "visual.", 1) if k.startswith("model.visual.") else k): v
        for k, v in load_file(os.path.join(src, "model.safetensors")).items()
    }
    save_safetensors(Path(d) / "model.safetensors", tensors, {"format": "pt"})
    transformers.logging.set_verbosity_error()
    paths = []
    for name, auto in (("causal-lm", transformers.AutoModelForCausalLM), ("vlm", transformers.AutoModel),
                       ("image-text-to-text", transformers.AutoModelForImageTextToText)):
        model, info = auto.from_pretrained(d, output_loading_info=True)
        paths.append({
            "name": name,
            "auto_class": auto.__name__,
            "class": type(model).__name__,
            "missing_keys": sorted(info["missing_keys"]),
            "unexpected_keys": sorted(info["unexpected_keys"]),
            "state_dict_tensors": len(model.state_dict()),
        })
    report = {
        "case": "visual-unprefixed",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "checkpoint_tensors": len(tensors),
        "vision_keys": sum(k.startswith("visual.") for k in tensors),
        "paths": paths,
    }
    with open(os.path.join(d, "golden", "load_report.json"), "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    print("visual-unprefixed", [(p["name"], len(p["missing_keys"]), len(p["unexpected_keys"])) for p in paths])


@torch.no_grad()
def drafter_window() -> None:
    import shutil

    from dflash.model import DFlashDraftModel

    src = os.path.join(ROOT, "fixtures", "toy-pair", "drafter")
    d = os.path.join(OUT, "drafter-window")
    os.makedirs(d, exist_ok=True)
    shutil.copy(os.path.join(src, "model.safetensors"), os.path.join(d, "model.safetensors"))
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    cfg["layer_types"] = ["sliding_attention", "full_attention"]
    cfg["sliding_window"] = 6
    cfg["use_sliding_window"] = False
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    g = torch.Generator().manual_seed(21)
    unused = DFlashDraftModel.from_pretrained(d, dtype=torch.float32).eval()
    used_cfg = json.loads(json.dumps(cfg))
    used_cfg["use_sliding_window"] = True
    used = DFlashDraftModel(type(unused.config)(**used_cfg)).eval()
    used.load_state_dict(unused.state_dict())
    h, b = unused.config.hidden_size, unused.block_size
    c = 20
    taps = len(unused.target_layer_ids)
    feats = torch.randn(1, c, h * taps, generator=g)
    noise = torch.randn(1, b, h, generator=g)
    pos = torch.arange(c + b)[None]
    tensors = {"target_hidden": feats[0], "noise_embedding": noise[0], "position_ids": pos[0]}
    for tag, model in (("unused", unused), ("used", used)):
        tensors[f"{tag}.hidden"] = model(target_hidden=feats, noise_embedding=noise, position_ids=pos)[0].contiguous()
    save_safetensors(Path(d) / "golden.safetensors", tensors,
                     {"format": "hsparity drafter-window golden v1", "dtype": "float32",
                      "unused": "config.json as dflash 0.1.0 loads it (use_sliding_window false)",
                      "used": "the same weights with use_sliding_window true"})
    facts = {
        "case": "drafter-window",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "config_sliding_window": cfg["sliding_window"],
        "resolved_sliding_window": unused.config.sliding_window,
        "resolved_sliding_window_used": used.config.sliding_window,
        "layer_types": list(unused.config.layer_types),
        "context_rows": c,
    }
    with open(os.path.join(d, "facts.json"), "w") as f:
        json.dump(facts, f, indent=1)
        f.write("\n")
    print("drafter-window", facts)


@torch.no_grad()
def drafter_extra() -> None:
    import shutil

    from dflash.model import DFlashDraftModel
    from safetensors.torch import load_file

    src = os.path.join(ROOT, "fixtures", "toy-pair", "drafter")
    d = os.path.join(OUT, "drafter-extra")
    os.makedirs(d, exist_ok=True)
    shutil.copy(os.path.join(src, "config.json"), os.path.join(d, "config.json"))
    tensors = load_file(os.path.join(src, "model.safetensors"))
    h = tensors["norm.weight"].shape[0]
    g = torch.Generator().manual_seed(11)
    tensors["input_norm.weight"] = (1 + 0.1 * torch.randn(h, generator=g)).to(tensors["norm.weight"].dtype)
    tensors["fc_norm.weight"] = (1 + 0.1 * torch.randn(h, generator=g)).to(tensors["norm.weight"].dtype)
    save_safetensors(Path(d) / "model.safetensors", tensors, {"format": "pt"})
    _, info = DFlashDraftModel.from_pretrained(d, output_loading_info=True)
    facts = {
        "case": "drafter-extra",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "dflash_unexpected_keys": sorted(info["unexpected_keys"]),
        "dflash_missing_keys": sorted(info["missing_keys"]),
    }
    with open(os.path.join(d, "facts.json"), "w") as f:
        json.dump(facts, f, indent=1)
        f.write("\n")
    print("drafter-extra", facts)


@torch.no_grad()
def norm_plus_one(model) -> None:
    d = os.path.join(OUT, "norm-plus-one")
    model.save_pretrained(os.path.join(d, "a"))
    norm_class = type(model.model.norm)
    shifted = []
    for name, mod in model.named_modules():
        if type(mod) is norm_class:
            mod.weight += 1.0
            shifted.append(f"{name}.weight")
    model.save_pretrained(os.path.join(d, "b"))
    # The saved keys of the shifted parameters (save_pretrained renames them,
    # e.g. model.layers.* -> model.language_model.layers.*): the keys whose
    # stored value is a shifted parameter's, found by value in b's file.
    from safetensors.torch import load_file

    stored = load_file(os.path.join(d, "b", "model.safetensors"))
    params = [mod.weight for _, mod in model.named_modules() if type(mod) is norm_class]
    keys = sorted(k for k, v in stored.items() if any(v.shape == p.shape and torch.equal(v, p) for p in params))
    assert len(keys) == len(shifted), (keys, shifted)
    for name, mod in model.named_modules():
        if type(mod) is norm_class:
            mod.weight -= 1.0
    facts = {
        "case": "norm-plus-one",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "norm_class": norm_class.__name__,
        "offset": 1.0,
        "modules": sorted(shifted),
        "tensors": keys,
    }
    with open(os.path.join(d, "facts.json"), "w") as f:
        json.dump(facts, f, indent=1)
        f.write("\n")
    print("norm-plus-one", len(shifted), "tensors")


if __name__ == "__main__":
    only = {"drafter-extra": drafter_extra, "drafter-window": drafter_window,
            "visual-unprefixed": visual_unprefixed, "normed-stream": normed_stream}
    if len(sys.argv) > 1:
        for case in sys.argv[1:]:
            if case not in only:
                sys.exit(f"no case {case!r} that runs alone; those that do: {', '.join(only)}")
            only[case]()
    else:
        main()
