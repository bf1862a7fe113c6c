#!/usr/bin/env python3
"""Generate hsparity's golden fixtures with HuggingFace transformers 5.23.0.

CI never runs this script: its outputs are committed under ``fixtures/`` and the
Rust tests read them. Regenerate only when the fixture contract changes.

How to run (from the repository root):

    python3 -m venv .venv && .venv/bin/pip install -r tools/requirements.txt \
        && .venv/bin/python tools/make_fixtures.py

The script is deterministic: fixed seeds, one CPU thread, deterministic torch
algorithms, fixed file ordering. Two runs give byte-identical files
(checked with ``sha256sum`` over ``fixtures/``). It always runs on CPU.

What it writes
==============

``fixtures/tiny-qwen3_5/`` -- a tiny, structurally complete Qwen3.5 checkpoint
    (``Qwen3_5ForConditionalGeneration``, ``model_type: qwen3_5``) with random
    weights, float32, sharded:

    * ``config.json`` exactly as ``save_pretrained`` writes it (see TEXT_CONFIG /
      VISION_CONFIG below for the values); ``generation_config.json`` if written.
    * ``model-0000i-of-0000N.safetensors`` (N >= 2) + ``model.safetensors.index.json``.
      Besides the model's own tensors, the last shard carries the 15 ``mtp.*``
      tensors that published checkpoints carry (transformers ignores them), and the
      index lists every tensor, mtp included.
    * Every weight is random, norms included: zero-centred RMSNorm weights
      (``(1 + w)`` form) ~ N(0, 0.1); the gated norm ``linear_attn.norm.weight``
      (plain ``w`` form) ~ 1 + N(0, 0.1), so a ``w`` vs ``1 + w`` slip shows.
      ``A_log = log U(1, 16)``; ``dt_bias ~ N(-4.5, 0.5)`` so that the per-token
      log-decay ``g = -exp(A_log) * softplus(a + dt_bias)`` is mostly in
      [-1.5, -0.005]: state carries across the 64-token chunk boundary.
    * ``tokenizer.json``: byte-level BPE trained with ``tokenizers`` on the text
      embedded below, with the pipeline of the Qwen tokenizers (NFC normalizer; Split on
      ``Qwen3_5Tokenizer``'s regex, then ByteLevel without regex; ByteLevel post-processor
      and decoder), so that ``AutoTokenizer`` (which builds ``Qwen3_5Tokenizer`` for
      ``model_type qwen3_5`` and keeps only tokenizer.json's vocab, merges, added tokens
      and post-processor) and the Rust ``tokenizers`` crate give the same ids. Vocab =
      TOKENIZER_VOCAB = the model's ``vocab_size``: the BPE is trained to
      TOKENIZER_VOCAB - 26 tokens (the 256-byte alphabet + merges) and the 26 Qwen added
      tokens follow, in Qwen/Qwen3-8B's order and with its ``special`` flags
      (``chat_fixtures.QWEN_ADDED_TOKENS``: ``<|endoftext|>``, ``<|im_start|>``,
      ``<|im_end|>``, ..., ``<tool_call>``, ..., ``<think>``, ``</think>``). The
      post-processor adds nothing: ``encode(text)`` yields the same ids with and without
      ``add_special_tokens``. ``eos_token_id`` in config.json is ``<|im_end|>``'s id, as in
      Qwen/Qwen3-8B.
    * ``tokenizer_config.json`` with the special-token fields of Qwen/Qwen3-8B's
      (``chat_fixtures.qwen_tokenizer_config``: ``added_tokens_decoder``,
      ``additional_special_tokens``, ``eos_token`` ``<|im_end|>``, ``pad_token``
      ``<|endoftext|>``, ``bos_token`` / ``unk_token`` null, ``tokenizer_class``
      ``Qwen2Tokenizer``) and no ``chat_template`` key.
    * ``chat_template.jinja``: the Qwen3.5 chat template, verbatim
      (``tools/chat_templates/qwen3_5.jinja``, see ``tools/chat_templates/README.md``).
    * ``prompts.jsonl``: one JSON object per line, ``{"text": ...}`` or
      ``{"input_ids": [...]}``, in this order:
        p0  short text prompt (8-15 tokens)
        p1  long text prompt (> 64 tokens, not a multiple of 64: crosses the GDN
            chunk boundary)
      Text prompts are tokenised with the tokenizer above, no special tokens.

``fixtures/tiny-qwen3_5/golden/`` -- transformers' outputs on those prompts:

    * ``causal-lm.safetensors``          AutoModelForCausalLM        -> Qwen3_5ForCausalLM
    * ``vlm.safetensors``                AutoModel                   -> Qwen3_5Model
    * ``py-dump-vlm.safetensors``        tools/dump_hidden_states.py (AutoModel), short prompt only
    * ``image-text-to-text.safetensors`` AutoModelForImageTextToText -> Qwen3_5ForConditionalGeneration

      hsparity dump format v1 (docs/dump-format.md). Each comes from
      ``model(input_ids=ids[None], output_hidden_states=True, use_cache=False)``,
      eager attention, fp32, eval, no_grad, batch 1, one prompt at a time.
      Keys for prompt k:
        ``p{k}.input_ids``          I64 [T]
        ``p{k}.hidden_states.{i}``  F32 [T, H], i = 0..=N (N = 6): 0 = embeddings,
                                    i = layer i-1 output, N = final-normed output
        ``p{k}.last_layer_output``  F32 [T, H]  raw output of the last decoder layer
                                    (forward hook), i.e. hidden_states.N before the norm
        ``p{k}.logits``             F32 [T, V]  causal-lm only (image-text-to-text logits are bitwise equal, asserted, not stored)
      ``__metadata__`` (all strings): format, checkpoint, loading_path, class,
      dtype, num_layers, tool_version.

    * ``load_report.json``: for each Auto class, what transformers reports when
      loading the checkpoint with default arguments (dtype "auto"): class,
      config class, config model_type, state_dict tensor count, parameter count
      (numel), missing / unexpected / mismatched keys from
      ``output_loading_info=True``, parameter dtype, and the WARNING-level load
      messages (ANSI stripped). Plus the checkpoint's own tensor count, and per path
      ``derived_dropped_silently`` = checkpoint tensors - state_dict tensors -
      unexpected keys (computed here: tensors dropped by ``_keys_to_ignore_on_load_unexpected``).

    * ``gdn_kernels.safetensors``: the Gated DeltaNet kernels on random inputs,
      one layer shape, B = 1, T = 100 (one full 64-chunk + a partial one),
      nk = 2 key heads, nv = 4 value heads, dk = dv = 16. GVA is NOT applied to
      the inputs: q and k have nk heads; the kernels repeat_interleave them to nv
      (value head h uses key head h // (nv / nk)), exactly as the model calls them.
      Inputs are float32, in the kernels' argument layout:
        ``q``      F32 [1, 100, 2, 16]   (before l2norm; the kernel normalises)
        ``k``      F32 [1, 100, 2, 16]
        ``v``      F32 [1, 100, 4, 16]
        ``g``      F32 [1, 100, 4]       log-decay (<= 0) = -exp(A_log) * softplus(a + dt_bias)
        ``beta``   F32 [1, 100, 4]       sigmoid(b)
        ``initial_state`` F32 [1, 4, 16, 16]  used only by the ``*_init`` outputs
      Outputs of ``torch_chunk_gated_delta_rule`` (chunk_size 64) and
      ``torch_recurrent_gated_delta_rule`` from
      ``transformers.models.qwen3_5.modeling_qwen3_5``, both with
      ``use_qk_l2norm_in_kernel=True, output_final_state=True``:
        ``chunk.out`` / ``recurrent.out``                F32 [1, 100, 4, 16]
        ``chunk.final_state`` / ``recurrent.final_state`` F32 [1, 4, 16, 16]  (S[k, v] per head)
        ``chunk_init.out``, ``chunk_init.final_state``, ``recurrent_init.out``,
        ``recurrent_init.final_state``: the same with ``initial_state`` given.
        ``chunk.out_no_carry``  F32 [1, 100, 4, 16]: the chunked kernel run on
          tokens [0, 64) and [64, 100) separately with a zero state: what a
          chunk kernel that forgot to carry the state would give (for the test's
          "the golden can tell" sanity check).
      ``__metadata__`` records the shapes, chunk size and measured differences.

``fixtures/divergence/<name>/`` -- one micro checkpoint per source of loading-path divergence
    (docs/loading-paths.md). Micro text config MICRO_TEXT_CONFIG: vocab 384 (the
    tiny tokenizer, copied in with its tokenizer_config.json), hidden 32, 4 layers [linear, full,
    linear, full], 2 heads / 1 kv head, head_dim 16 (4 rotary dims), GDN 1 key head / 2 value heads of
    dim 8; vision tower MICRO_VISION_CONFIG (depth 1, hidden 16, out 32) where the checkpoint is a VLM.
    Weights random as above (``randomise``), one seed per fixture; no ``mtp.*``. Each is written with
    ``save_pretrained`` and then post-processed (config.json edits, key renames / drops); every
    safetensors file is rewritten deterministically. Names (contracts for the Rust tests):

      fp16-disk                 VLM, fp16 weights, no top-level dtype, text_config.dtype = bfloat16
      tied-top-level            VLM, fp32, tie_word_embeddings true at the top level only, no lm_head.weight,
                                2 shards + index
      nested-prefix             VLM, fp32, text keys model.language_model.language_model.language_model.*
      legacy-duplicated-prefix  VLM, fp32, text keys model.language_model.model.*
      text-only-causal          Qwen3_5ForCausalLM (qwen3_5_text), fp32, keys model.* + lm_head.weight
      bf16-auto                 VLM, bf16 as save_pretrained writes it

    Each holds ``prompts.jsonl`` (p0 short text, 11 tokens; p1 text of 70 tokens, crossing the
    64-token chunk) and ``golden/``:

    * ``<path>.safetensors`` -- dump format v1 (as above), for the paths listed in the fixture's
      ``load_report.json`` ("golden" field), from ``from_pretrained(dir, attn_implementation="eager")``
      with the default dtype ("auto"): the model runs in the dtype transformers picked, the dump holds
      ``.float()`` of it and ``__metadata__["dtype"]`` says which (f32 / bf16 / f16).
      ``torch.manual_seed(DIV_INIT_SEED)`` precedes every ``from_pretrained``, so MISSING tensors
      (random init) are reproducible in Python; the Rust side cannot reproduce them.
    * ``load_report.json`` -- what the fixture reproduces and how it was post-processed, the
      config.json dtype/tie fields, on-disk tensor count / dtypes / first tensor, and per Auto class:
      class, config class, model_type, parameter dtype, state_dict tensor count, numel, missing /
      unexpected / mismatched keys, LOAD REPORT warnings (rows sorted, clipped), whether lm_head is the
      embedding tensor (``tied``; null when the class has no lm_head), the random-init seed and stats
      of MISSING tensors, or the error when ``from_pretrained`` raised. ``cross_path_goldens`` says
      per pair of goldens whether hidden states and logits are bitwise equal (max |diff| too).

``fixtures/tiny-qwen3/`` -- a tiny dense Qwen3 checkpoint (``model_type: qwen3``), built last (own seed QWEN3_SEED):
    ``Qwen3ForCausalLM(Qwen3Config(**QWEN3_CONFIG))``: vocab 384 (the tiny tokenizer, copied in with its
    tokenizer_config.json; tokenizer.json's Split regex is Qwen2Tokenizer's, which AutoTokenizer builds for
    model_type qwen3; ``chat_template.jinja`` = ``tools/chat_templates/qwen3.jinja``), hidden 32, intermediate 64, 3 layers, 2 heads / 1 kv head, head_dim 24
    (deliberately != hidden / heads), ``rope_parameters = {rope_type: default, rope_theta: 1e6}``, eps 1e-6,
    max positions 256, ``tie_word_embeddings: true``, no attention bias, float32, single ``model.safetensors``
    (35 tensors: save_pretrained omits ``lm_head.weight``, asserted and recorded). Every weight random
    (``randomise_qwen3``): norms (``w * norm(x)`` form, q_norm / k_norm included) ~ 1 + N(0, 0.1), embedding
    ~ N(0, 1), linears ~ N(0, 1/fan_in) with o_proj / down_proj damped by 0.5. ``prompts.jsonl``: the
    divergence prompts (11 and 70 tokens). ``golden/``, loaded like the divergence fixtures (``div_path``:
    dtype "auto" -> float32, eager, use_cache=False):

    * ``causal-lm.safetensors`` (AutoModelForCausalLM -> Qwen3ForCausalLM, logits included) and
      ``vlm.safetensors`` (AutoModel -> Qwen3Model, no logits): dump format v1 as above, N = 3;
      ``hidden_states.3`` is the final-normed output (= norm(last_layer_output), asserted).
    * ``load_report.json``: the config.json fields as written, whether save_pretrained wrote lm_head, the
      checkpoint inventory, per Auto class the same facts as the divergence reports (AutoModelForImageTextToText
      raises ``ValueError: Unrecognized configuration class ... Qwen3Config``: message recorded), whether
      hidden_states[N] is final-normed, and whether causal-lm and vlm hidden states are bitwise equal (they are).

``fixtures/qwen3.6-27b/`` -- the published Qwen3.6-27B ``config.json`` and tensor table
    (``tensors.json``): committed reference data, not written by this script.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import sys
import warnings
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

import transformers  # noqa: E402
from transformers import (  # noqa: E402
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    Qwen3_5Config,
    Qwen3_5ForCausalLM,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5TextConfig,
    Qwen3Config,
    Qwen3ForCausalLM,
)
from transformers.models.qwen3 import modeling_qwen3 as mq3  # noqa: E402
from transformers.models.qwen3_5 import modeling_qwen3_5 as mq  # noqa: E402

warnings.filterwarnings("ignore")

REPO = Path(__file__).resolve().parent.parent
CKPT_REL = "fixtures/tiny-qwen3_5"
SEED = 20260209

EXPECTED_TRANSFORMERS = "5.23.0"

# ------------------------------------------------------------------------------------------------
# Configuration
# ------------------------------------------------------------------------------------------------
sys.path.insert(0, str(Path(__file__).resolve().parent))
import chat_fixtures  # noqa: E402  (tools/ sibling: Qwen special tokens, tokenizer_config layout, chat goldens)
import fixture_configs as fc  # noqa: E402  (tools/ sibling: config pieces shared with the other generators)

TOKENIZER_VOCAB = 384
BPE_VOCAB = TOKENIZER_VOCAB - len(chat_fixtures.QWEN_ADDED_TOKENS)  # byte alphabet + merges; added tokens follow
# eos_token_id of the configs: <|im_end|>, as Qwen/Qwen3-8B's config.json has it
EOS_ID = BPE_VOCAB + [t for t, _ in chat_fixtures.QWEN_ADDED_TOKENS].index(chat_fixtures.QWEN_EOS)

LAYER_TYPES = fc.hybrid_layer_types(linear_per_full=2, blocks=2)
TEXT_CONFIG = fc.qwen3_5_text_config(
    vocab_size=TOKENIZER_VOCAB,
    hidden_size=64,
    intermediate_size=128,
    layer_types=LAYER_TYPES,
    # GQA, n_rep = 2; rotary dim = 32 * 0.25 = 8 -> 4 frequencies; mrope_section sums to 4
    attention=fc.attention_fields(heads=4, kv_heads=2, head_dim=32),
    # GVA: value heads = 2 x key heads
    gated_deltanet=fc.gated_deltanet_fields(key_heads=2, value_heads=4, head_dim=16),
    max_position_embeddings=512,
    eos_token_id=EOS_ID,
    rope_parameters=fc.interleaved_mrope([2, 1, 1]),
)
VISION_CONFIG = fc.qwen3_5_vision_config(
    depth=2,
    hidden_size=32,
    intermediate_size=64,
    num_heads=2,
    patch_size=4,
    spatial_merge_size=2,
    out_hidden_size=64,
    num_position_embeddings=16,
)
MAX_SHARD_SIZE = "600KB"

# Auto classes, in the order of the golden files.
PATHS = [
    ("causal-lm", "AutoModelForCausalLM", AutoModelForCausalLM),
    ("vlm", "AutoModel", AutoModel),
    ("image-text-to-text", "AutoModelForImageTextToText", AutoModelForImageTextToText),
]

# ------------------------------------------------------------------------------------------------
# Tokenizer training text (English prose + a little code) and prompts
# ------------------------------------------------------------------------------------------------
TRAIN_TEXT = r'''
The quick brown fox jumps over the lazy dog. A model is only as good as the data it was trained on,
and a test is only as good as the reference it compares against. When two loading paths of the same
checkpoint disagree, the first question is where: which layer, which token, and by how much.
Hidden states flow through the residual stream one layer at a time. Each layer reads the stream,
normalises it, mixes information across tokens, and writes its update back. Linear attention keeps a
small recurrent state for every head; full attention looks at every earlier token again.
The state decays a little at every step, and the delta rule writes only the part of the new value
that the old state could not already predict. Chunked and recurrent forms compute the same thing in
different orders, so their results agree up to rounding.
In the morning the river was calm and the boats waited by the old stone bridge. Children ran along
the bank, and their laughter carried across the water to the market on the other side, where the
bakers had been working since four o'clock and the smell of fresh bread filled the narrow streets.
People often say that numbers do not lie, but they rarely say which numbers were measured, with
what tolerance, and on which machine. Write it down: the version, the seed, the shape, the dtype.

def rms_norm(x, weight, eps=1e-6):
    variance = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(variance + eps) * (1.0 + weight)

def softplus(x):
    return math.log1p(math.exp(-abs(x))) + max(x, 0.0)

for layer_index, layer_type in enumerate(config.layer_types):
    if layer_type == "linear_attention":
        hidden = hidden + layer.linear_attn(norm(hidden))
    else:
        hidden = hidden + layer.self_attn(norm(hidden), cos, sin)
    hidden = hidden + layer.mlp(post_norm(hidden))

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

let config: Config = serde_json::from_str(&text)?;
println!("{} layers, hidden size {}", config.num_hidden_layers, config.hidden_size);
if value > threshold { return Err(anyhow!("tolerance exceeded: {value} > {threshold}")); }

{"model_type": "qwen3_5", "hidden_size": 5120, "num_hidden_layers": 64, "vocab_size": 248320}
SELECT name, value FROM results WHERE layer = 12 ORDER BY value DESC LIMIT 10;
x = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]; y = {"a": 1.5, "b": -2.25, "c": 3e-4}
'''

PROMPT_SHORT = "The hidden state of the model."
PROMPT_LONG = (
    "When the two loading paths of one checkpoint disagree, we want to know where it starts: "
    "which layer, which token, and by how much. def max_abs_diff(a, b): "
    "return (a - b).abs().max()"
)


# ------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------
def log(*a):
    print(*a, flush=True)


def setup_determinism():
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.use_deterministic_algorithms(True)


def write_json(path: Path, obj, indent=2):
    path.write_text(json.dumps(obj, indent=indent, sort_keys=False, ensure_ascii=False) + "\n")


def train_tokenizer() -> Tokenizer:
    """Byte-level BPE with the Qwen3.5 tokenizer pipeline (see the module docstring), BPE_VOCAB tokens,
    then the Qwen added tokens."""
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(chat_fixtures.QWEN3_5_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB,
        min_frequency=2,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([TRAIN_TEXT], trainer=trainer)
    assert tok.get_vocab_size() == BPE_VOCAB, tok.get_vocab_size()
    chat_fixtures.add_qwen_tokens(tok)
    assert tok.get_vocab_size() == TOKENIZER_VOCAB, tok.get_vocab_size()
    assert tok.token_to_id(chat_fixtures.QWEN_EOS) == EOS_ID
    return tok


def encode(tok: Tokenizer, text: str) -> list[int]:
    a = tok.encode(text, add_special_tokens=False).ids
    b = tok.encode(text, add_special_tokens=True).ids
    assert a == b, "tokenizer must not add special tokens"
    assert tok.decode(a) == text, "byte-level BPE must round-trip"
    return a


@torch.no_grad()
def randomise(model: torch.nn.Module, gen: torch.Generator):
    """Give every parameter a random value (see module docstring for the recipe)."""

    def normal(p, std, mean=0.0):
        p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * std + mean)

    for name, p in model.named_parameters():
        if name.endswith("linear_attn.A_log"):
            p.copy_(torch.empty(p.shape, dtype=torch.float32).uniform_(1.0, 16.0, generator=gen).log())
        elif name.endswith("linear_attn.dt_bias"):
            normal(p, 0.5, -4.5)
        elif name.endswith("linear_attn.norm.weight"):
            normal(p, 0.1, 1.0)  # plain-w gated RMSNorm
        elif name.startswith("model.visual.") and ("norm" in name):
            normal(p, 0.1, 1.0 if name.endswith(".weight") else 0.0)  # LayerNorm weight/bias
        elif "norm" in name:
            normal(p, 0.1)  # zero-centred (1 + w) RMSNorm
        elif name.endswith(".bias"):
            normal(p, 0.02)
        elif name.endswith("embed_tokens.weight"):
            normal(p, 1.0)
        elif name.endswith("conv1d.weight"):
            normal(p, 0.5)  # fan_in = kernel size 4
        elif p.dim() >= 2:
            fan_in = p[0].numel()
            # writers into the residual stream are damped so 6 layers stay O(1..10)
            damp = 0.5 if re.search(r"(o_proj|out_proj|down_proj)\.weight$", name) else 1.0
            normal(p, damp / fan_in**0.5)
        else:
            normal(p, 0.1)


def mtp_tensors(gen: torch.Generator) -> dict[str, torch.Tensor]:
    H, I = TEXT_CONFIG["hidden_size"], TEXT_CONFIG["intermediate_size"]
    nh, nkv, hd = TEXT_CONFIG["num_attention_heads"], TEXT_CONFIG["num_key_value_heads"], TEXT_CONFIG["head_dim"]

    def w(*shape):
        return torch.randn(shape, generator=gen) / shape[-1] ** 0.5

    def n(*shape):
        return torch.randn(shape, generator=gen) * 0.1

    return {
        "mtp.fc.weight": w(H, 2 * H),
        "mtp.pre_fc_norm_embedding.weight": n(H),
        "mtp.pre_fc_norm_hidden.weight": n(H),
        "mtp.norm.weight": n(H),
        "mtp.layers.0.input_layernorm.weight": n(H),
        "mtp.layers.0.post_attention_layernorm.weight": n(H),
        "mtp.layers.0.self_attn.q_proj.weight": w(2 * nh * hd, H),
        "mtp.layers.0.self_attn.k_proj.weight": w(nkv * hd, H),
        "mtp.layers.0.self_attn.v_proj.weight": w(nkv * hd, H),
        "mtp.layers.0.self_attn.o_proj.weight": w(H, nh * hd),
        "mtp.layers.0.self_attn.q_norm.weight": n(hd),
        "mtp.layers.0.self_attn.k_norm.weight": n(hd),
        "mtp.layers.0.mlp.gate_proj.weight": w(I, H),
        "mtp.layers.0.mlp.up_proj.weight": w(I, H),
        "mtp.layers.0.mlp.down_proj.weight": w(H, I),
    }


def shard_metadata(path: Path) -> dict:
    with safe_open(str(path), "pt") as f:
        return f.metadata() or {}


def save_safetensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]):
    """Write a safetensors file byte-for-byte deterministically.

    ``safetensors.torch.save_file`` serialises ``__metadata__`` from a Rust HashMap, so
    its key order (and the file's bytes) changes from run to run when there is more
    than one metadata key. Here: metadata keys sorted, tensors laid out in name order,
    header padded with spaces to a multiple of 8 bytes (as safetensors does).
    """
    dtypes = {torch.float32: "F32", torch.int64: "I64", torch.float16: "F16", torch.bfloat16: "BF16"}
    header: dict = {"__metadata__": dict(sorted(metadata.items()))}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        data = t.view(torch.uint8).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[name] = {"dtype": dtypes[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)
    back = load_file(str(path))
    assert set(back) == set(tensors) and all(torch.equal(back[k], tensors[k]) for k in tensors)
    assert shard_metadata(path) == metadata


def build_checkpoint(ckpt: Path, vocab: int):
    setup_determinism()
    gen = torch.Generator().manual_seed(SEED)
    assert TEXT_CONFIG["vocab_size"] == vocab
    config = Qwen3_5Config(text_config=dict(TEXT_CONFIG), vision_config=dict(VISION_CONFIG), tie_word_embeddings=False)
    model = Qwen3_5ForConditionalGeneration(config).eval().float()
    randomise(model, gen)
    model.save_pretrained(str(ckpt), max_shard_size=MAX_SHARD_SIZE)

    index_path = ckpt / "model.safetensors.index.json"
    assert index_path.exists(), "expected a sharded checkpoint; lower MAX_SHARD_SIZE"
    index = json.loads(index_path.read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 2, shards
    last = ckpt / shards[-1]
    meta = shard_metadata(last)
    sd = {k: v.clone() for k, v in load_file(str(last)).items()}  # detach from the mmap before rewriting
    mtp = mtp_tensors(gen)
    assert not (set(mtp) & set(sd))
    sd.update(mtp)
    save_safetensors(last, sd, meta)  # deterministic even if meta had several keys
    for k in mtp:
        index["weight_map"][k] = shards[-1]
    index["weight_map"] = dict(sorted(index["weight_map"].items()))
    md = index.setdefault("metadata", {})
    mtp_bytes = sum(t.numel() * t.element_size() for t in mtp.values())
    mtp_params = sum(t.numel() for t in mtp.values())
    if "total_size" in md:
        md["total_size"] += mtp_bytes
    if "total_parameters" in md:
        md["total_parameters"] += mtp_params
    write_json(index_path, index)
    return model


# ------------------------------------------------------------------------------------------------
# Loading and golden dumps
# ------------------------------------------------------------------------------------------------
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.records: list[str] = []

    def emit(self, record):
        self.records.append(f"{record.levelname} {record.name}: {_ANSI.sub('', record.getMessage())}")


def load(auto_cls, ckpt_rel: str, **kw):
    cap = _Capture()
    lg = logging.getLogger("transformers")
    lg.addHandler(cap)
    try:
        model, info = auto_cls.from_pretrained(ckpt_rel, output_loading_info=True, **kw)
    finally:
        lg.removeHandler(cap)
    model.eval()
    return model, info, cap.records


def checkpoint_keys(ckpt: Path) -> list[str]:
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    keys = []
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(str(ckpt / shard), "pt") as f:
            keys.extend(f.keys())
    assert sorted(keys) == sorted(index["weight_map"]), "index must list every tensor"
    return sorted(keys)


def load_report(ckpt: Path) -> dict:
    keys = checkpoint_keys(ckpt)
    report = {
        "tool_version": f"transformers {transformers.__version__}",
        "torch_version": torch.__version__.split("+")[0],
        "checkpoint": CKPT_REL,
        "load_arguments": "from_pretrained(checkpoint, output_loading_info=True)  # dtype defaults to 'auto'",
        "checkpoint_tensors": len(keys),
        "checkpoint_tensors_by_prefix": {
            "model.language_model.": sum(k.startswith("model.language_model.") for k in keys),
            "model.visual.": sum(k.startswith("model.visual.") for k in keys),
            "lm_head.": sum(k.startswith("lm_head.") for k in keys),
            "mtp.": sum(k.startswith("mtp.") for k in keys),
        },
        "paths": [],
    }
    for path_name, auto_name, auto_cls in PATHS:
        m, info, records = load(auto_cls, CKPT_REL)
        sd = m.state_dict()
        params = list(m.named_parameters())
        dtypes = sorted({str(p.dtype).replace("torch.", "") for _, p in params})
        entry = {
            "name": path_name,
            "auto_class": auto_name,
            "class": type(m).__name__,
            "config_class": type(m.config).__name__,
            "model_type": m.config.model_type,
            "attn_implementation": m.config._attn_implementation,
            "dtype": dtypes[0] if len(dtypes) == 1 else dtypes,
            "state_dict_tensors": len(sd),
            "named_parameters": len(params),
            "numel": sum(p.numel() for _, p in params),
            "missing_keys": sorted(info.get("missing_keys") or []),
            "unexpected_keys": sorted(info.get("unexpected_keys") or []),
            "mismatched_keys": sorted(str(x) for x in (info.get("mismatched_keys") or [])),
            "error_msgs": [str(x) for x in (info.get("error_msgs") or [])],
            "load_warnings": records,
            # derived here, not reported by transformers: checkpoint tensors neither loaded nor
            # reported (ignore rules: ^mtp.*, and ^model.visual.* for the causal-lm class)
            "derived_dropped_silently": len(keys) - len(sd) - len(info.get("unexpected_keys") or []),
            "first_state_dict_keys": list(sd.keys())[:3],
            "last_state_dict_keys": list(sd.keys())[-2:],
        }
        report["paths"].append(entry)
        del m
    return report


def final_norm(model):
    for name, mod in model.named_modules():
        if re.fullmatch(r"(model\.)?(language_model\.)?norm", name):
            return mod
    raise RuntimeError("final norm not found")


@torch.no_grad()
def golden(path_name: str, auto_cls, prompts_ids: list[list[int]], out_path: Path) -> dict:
    setup_determinism()
    m, _, _ = load(auto_cls, CKPT_REL, dtype=torch.float32, attn_implementation="eager")
    assert all(p.dtype == torch.float32 for p in m.parameters())
    N = TEXT_CONFIG["num_hidden_layers"]
    tensors, stats = forward_dump(m, prompts_ids, N)
    metadata = {
        "format": "hsparity.dump.v1",
        "checkpoint": CKPT_REL,
        "loading_path": path_name,
        "class": type(m).__name__,
        "dtype": "f32",
        "num_layers": str(N),
        "tool_version": f"transformers {transformers.__version__}",
    }
    # image-text-to-text logits are bitwise equal to causal-lm's (asserted below); the
    # file keeps hidden states only, to stay inside the fixture size budget.
    saved = {k: v for k, v in tensors.items() if path_name != "image-text-to-text" or not k.endswith(".logits")}
    save_safetensors(out_path, saved, metadata)
    return {"class": type(m).__name__, "tensors": tensors, "max_abs": stats}


@torch.no_grad()
def gdn_golden(out_path: Path) -> dict:
    setup_determinism()
    gen = torch.Generator().manual_seed(SEED + 1)
    B, T, nk, nv, dk, dv = 1, 100, 2, 4, 16, 16
    q = torch.randn(B, T, nk, dk, generator=gen)
    k = torch.randn(B, T, nk, dk, generator=gen)
    v = torch.randn(B, T, nv, dv, generator=gen)
    a = torch.randn(B, T, nv, generator=gen)
    b = torch.randn(B, T, nv, generator=gen)
    A_log = torch.empty(nv).uniform_(1.0, 16.0, generator=gen).log()
    dt_bias = torch.randn(nv, generator=gen) * 0.5 - 4.5
    g = -A_log.exp() * F.softplus(a + dt_bias)
    beta = torch.sigmoid(b)
    init = torch.randn(B, nv, dk, dv, generator=gen) * 0.5

    chunk = mq.torch_chunk_gated_delta_rule
    rec = mq.torch_recurrent_gated_delta_rule
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
    co, cs = chunk(q, k, v, g, beta, chunk_size=64, **kw)
    ro, rs = rec(q, k, v, g, beta, **kw)
    cio, cis = chunk(q, k, v, g, beta, chunk_size=64, initial_state=init, **kw)
    rio, ris = rec(q, k, v, g, beta, initial_state=init, **kw)
    n0, _ = chunk(q[:, :64], k[:, :64], v[:, :64], g[:, :64], beta[:, :64], chunk_size=64, **kw)
    n1, _ = chunk(q[:, 64:], k[:, 64:], v[:, 64:], g[:, 64:], beta[:, 64:], chunk_size=64, **kw)
    no_carry = torch.cat([n0, n1], dim=1)

    def mad(x, y):
        return float((x.double() - y.double()).abs().max())

    measured = {
        "chunk_vs_recurrent_out_max_abs": mad(co, ro),
        "chunk_vs_recurrent_state_max_abs": mad(cs, rs),
        "chunk_vs_recurrent_init_out_max_abs": mad(cio, rio),
        "chunk_vs_recurrent_init_state_max_abs": mad(cis, ris),
        "no_carry_vs_chunk_out_max_abs": mad(no_carry, co),
        "out_max_abs": float(co.abs().max()),
        "state_max_abs": float(cs.abs().max()),
        "g_min": float(g.min()),
        "g_max": float(g.max()),
        "g_mean": float(g.mean()),
    }
    tensors = {
        "q": q, "k": k, "v": v, "g": g, "beta": beta, "initial_state": init,
        "chunk.out": co, "chunk.final_state": cs,
        "recurrent.out": ro, "recurrent.final_state": rs,
        "chunk_init.out": cio, "chunk_init.final_state": cis,
        "recurrent_init.out": rio, "recurrent_init.final_state": ris,
        "chunk.out_no_carry": no_carry,
    }
    tensors = {k_: t.float().contiguous() for k_, t in tensors.items()}
    metadata = {
        "format": "hsparity.gdn_kernels.v1",
        "source": "transformers.models.qwen3_5.modeling_qwen3_5.torch_{chunk,recurrent}_gated_delta_rule",
        "tool_version": f"transformers {transformers.__version__}",
        "layout": "q,k [B,T,nk,dk]; v [B,T,nv,dv]; g,beta [B,T,nv]; state [B,nv,dk,dv]; out [B,T,nv,dv]",
        "gva": "not applied to inputs; kernel repeat_interleaves q,k: value head h uses key head h // (nv/nk)",
        "use_qk_l2norm_in_kernel": "true",
        "chunk_size": "64",
        "B": str(B), "T": str(T), "nk": str(nk), "nv": str(nv), "dk": str(dk), "dv": str(dv),
        **{k_: f"{v_:.6e}" for k_, v_ in measured.items()},
    }
    save_safetensors(out_path, tensors, metadata)
    return measured


@torch.no_grad()
def decay_stats(prompts_ids) -> dict:
    """Per-token log-decay g seen by the model's GDN layers on the long prompt."""
    m, _, _ = load(AutoModelForCausalLM, CKPT_REL, dtype=torch.float32, attn_implementation="eager")
    gs = []
    hooks = []
    for layer in m.model.layers:
        if hasattr(layer, "linear_attn"):
            la = layer.linear_attn

            def hook(mod, args, out, la=la):
                a = out
                gs.append(-la.A_log.float().exp() * F.softplus(a.float() + la.dt_bias))

            hooks.append(la.in_proj_a.register_forward_hook(hook))
    m(input_ids=torch.tensor(prompts_ids[1])[None], use_cache=False)
    for h in hooks:
        h.remove()
    g = torch.cat([x.flatten() for x in gs])
    chunk_decay = [float(x[0, :64].sum(0).exp().max()) for x in gs]  # per layer, best-remembering head
    return {"g_min": float(g.min()), "g_median": float(g.median()), "g_max": float(g.max()),
            "max_64_token_decay_per_layer": chunk_decay}


# ------------------------------------------------------------------------------------------------
# Divergence fixtures: one micro checkpoint per source of loading-path divergence
# ------------------------------------------------------------------------------------------------
DIV_REL = "fixtures/divergence"
DIV_SEED = SEED + 100
DIV_INIT_SEED = 1234  # torch.manual_seed(...) right before every from_pretrained (random init of MISSING keys)

MICRO_LAYER_TYPES = fc.hybrid_layer_types(linear_per_full=1, blocks=2)
MICRO_TEXT_CONFIG = fc.qwen3_5_text_config(
    vocab_size=TOKENIZER_VOCAB,
    hidden_size=32,
    intermediate_size=64,
    layer_types=MICRO_LAYER_TYPES,
    # GQA, n_rep = 2; rotary dim = 16 * 0.25 = 4 -> 2 frequencies; mrope_section sums to 2
    attention=fc.attention_fields(heads=2, kv_heads=1, head_dim=16),
    # GVA: value heads = 2 x key heads
    gated_deltanet=fc.gated_deltanet_fields(key_heads=1, value_heads=2, head_dim=8),
    max_position_embeddings=128,
    tie_word_embeddings=None,  # left out: micro_vlm sets the top-level flag; text-only keeps the default
    eos_token_id=EOS_ID,
    rope_parameters=fc.interleaved_mrope([1, 1, 0]),
)
MICRO_VISION_CONFIG = fc.MICRO_VISION_CONFIG
DIV_PROMPT_SHORT = "The layer reads the hidden state."
DIV_PROMPT_LONG = (
    "When two loading paths of the same checkpoint disagree, the first question is where: "
    "which layer, which token, and by how much? Write."
)
PATH_BY_NAME = {p[0]: p for p in PATHS}
DTYPE_SHORT = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
ST_DTYPE = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64"}


def micro_vlm(gen: torch.Generator, tie: bool = False) -> Qwen3_5ForConditionalGeneration:
    cfg = Qwen3_5Config(
        text_config=dict(MICRO_TEXT_CONFIG),
        vision_config=dict(MICRO_VISION_CONFIG),
        tie_word_embeddings=tie,
    )
    model = Qwen3_5ForConditionalGeneration(cfg).eval().float()
    randomise(model, gen)
    return model


def checkpoint_files(ckpt: Path) -> list[str]:
    index = ckpt / "model.safetensors.index.json"
    if index.exists():
        return sorted(set(json.loads(index.read_text())["weight_map"].values()))
    return ["model.safetensors"]


def checkpoint_inventory(ckpt: Path) -> dict:
    """Tensor names and on-disk dtypes, read from the safetensors headers."""
    names, dtypes, first = [], set(), None
    for fname in checkpoint_files(ckpt):
        raw = (ckpt / fname).read_bytes()
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8:8 + n])
        header.pop("__metadata__", None)
        # safetensors lays tensors out in data_offsets order: the "first" tensor is the lowest offset
        for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            names.append(name)
            dtypes.add(ST_DTYPE.get(info["dtype"], info["dtype"]))
            if first is None:
                first = (fname, name, ST_DTYPE.get(info["dtype"], info["dtype"]))
    index = ckpt / "model.safetensors.index.json"
    if index.exists():
        assert sorted(names) == sorted(json.loads(index.read_text())["weight_map"]), "index must list every tensor"
    return {"names": sorted(names), "dtypes": sorted(dtypes), "first_tensor": first}


def rewrite_checkpoint(ckpt: Path, rename=None, drop=()) -> dict:
    """Apply a key rename / drop to every shard (and the index), written deterministically."""
    index_path = ckpt / "model.safetensors.index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else None
    dropped, renamed = [], 0
    for fname in checkpoint_files(ckpt):
        meta = shard_metadata(ckpt / fname)
        sd = {k: v.clone() for k, v in load_file(str(ckpt / fname)).items()}
        out = {}
        for k, v in sd.items():
            if k in drop:
                dropped.append(k)
                continue
            nk = rename(k) if rename else k
            renamed += nk != k
            out[nk] = v
        save_safetensors(ckpt / fname, out, meta)
        if index is not None:
            for k in sd:
                index["weight_map"].pop(k, None)
            for k in out:
                index["weight_map"][k] = fname
    if index is not None:
        index["weight_map"] = dict(sorted(index["weight_map"].items()))
        write_json(index_path, index)
    return {"renamed": renamed, "dropped": sorted(dropped)}


def edit_config(ckpt: Path, fn):
    path = ckpt / "config.json"
    cfg = json.loads(path.read_text())
    fn(cfg)
    # same layout as PretrainedConfig.to_json_file
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def config_dtype_fields(ckpt: Path) -> dict:
    cfg = json.loads((ckpt / "config.json").read_text())
    out = {"dtype": cfg.get("dtype", "<absent>"), "tie_word_embeddings": cfg.get("tie_word_embeddings", "<absent>")}
    for sub in ("text_config", "vision_config"):
        if sub in cfg:
            out[f"{sub}.dtype"] = cfg[sub].get("dtype", "<absent>")
            if sub == "text_config":
                out[f"{sub}.tie_word_embeddings"] = cfg[sub].get("tie_word_embeddings", "<absent>")
    return out


# --- the six checkpoints ---------------------------------------------------------------------------
def build_fp16_disk(ckpt: Path, gen: torch.Generator) -> dict:
    model = micro_vlm(gen)
    model.half().save_pretrained(str(ckpt))

    def fix(cfg):
        cfg.pop("dtype", None)  # no top-level dtype (as in the published 27B config.json)
        cfg["text_config"]["dtype"] = "bfloat16"

    edit_config(ckpt, fix)
    rewrite_checkpoint(ckpt)
    return {
        "reproduces": "dtype resolution: no top-level dtype + text_config.dtype=bfloat16 + fp16 weights on disk",
        "post_processing": "model.half().save_pretrained(dir); config.json: delete top-level 'dtype', set "
                           "text_config.dtype = 'bfloat16'",
        "goldens": ["causal-lm", "vlm"]  # image-text-to-text is bitwise equal to vlm (recorded); kept out for size,
    }


def build_tied_top_level(ckpt: Path, gen: torch.Generator) -> dict:
    model = micro_vlm(gen, tie=True)
    assert model.lm_head.weight is model.model.language_model.embed_tokens.weight
    model.save_pretrained(str(ckpt), max_shard_size="150KB")
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is True, cfg.get("tie_word_embeddings")
    # transformers 5.23 writes text_config.tie_word_embeddings = false for this config
    assert cfg["text_config"].get("tie_word_embeddings") is False, cfg["text_config"].get("tie_word_embeddings")
    saved = checkpoint_inventory(ckpt)["names"]
    lm_head_saved = "lm_head.weight" in saved
    rw = rewrite_checkpoint(ckpt, drop={"lm_head.weight"})
    assert len(checkpoint_files(ckpt)) == 2, checkpoint_files(ckpt)
    return {
        "reproduces": "tied embeddings: tie_word_embeddings=true only at the top level, lm_head.weight absent",
        "post_processing": "Qwen3_5Config(tie_word_embeddings=True) -> save_pretrained(dir, max_shard_size='150KB') "
                           "(2 shards + index); lm_head.weight removed from the shards and the index if present",
        "save_pretrained_wrote_lm_head": lm_head_saved,
        "removed_by_post_processing": rw["dropped"],
        "config_as_saved": {"tie_word_embeddings": cfg["tie_word_embeddings"],
                            "text_config.tie_word_embeddings": cfg["text_config"].get("tie_word_embeddings")},
        "goldens": ["causal-lm", "image-text-to-text"]  # vlm hidden states equal both (recorded),
    }


def _reprefix(new_prefix: str):
    old = "model.language_model."

    def f(k):
        return new_prefix + k[len(old):] if k.startswith(old) else k

    return f


def build_nested_prefix(ckpt: Path, gen: torch.Generator) -> dict:
    # bf16 on disk: the values never load (every text key is MISSING); half the bytes.
    micro_vlm(gen).to(torch.bfloat16).save_pretrained(str(ckpt))
    rw = rewrite_checkpoint(ckpt, rename=_reprefix("model.language_model.language_model.language_model."))
    return {
        "reproduces": "key prefixes: text keys under model.language_model.language_model.language_model.* "
                      "(no rename rule maps them back)",
        "post_processing": "save_pretrained(dir); every model.language_model.X key renamed to "
                           "model.language_model.language_model.language_model.X",
        "renamed_keys": rw["renamed"],
        "goldens": [],
        "goldens_skipped_because": "every text weight is MISSING on every path: hidden states come from "
                                   "random init, which the Rust side cannot reproduce",
    }


def build_legacy_prefix(ckpt: Path, gen: torch.Generator) -> dict:
    # bf16 on disk (size budget); every path loads bf16.
    micro_vlm(gen).to(torch.bfloat16).save_pretrained(str(ckpt))
    rw = rewrite_checkpoint(ckpt, rename=_reprefix("model.language_model.model."))
    return {
        "reproduces": "key prefixes: legacy duplicated prefix model.language_model.model.* that the always-on "
                      "rename ^model.language_model.model -> model.language_model maps back",
        "post_processing": "save_pretrained(dir); every model.language_model.X key renamed to "
                           "model.language_model.model.X",
        "renamed_keys": rw["renamed"],
        "goldens": ["causal-lm", "vlm"],
    }


def build_text_only(ckpt: Path, gen: torch.Generator) -> dict:
    cfg = Qwen3_5TextConfig(**MICRO_TEXT_CONFIG)
    model = Qwen3_5ForCausalLM(cfg).eval().float()
    randomise(model, gen)
    # bf16 on disk (size budget); both paths load bf16.
    model.to(torch.bfloat16).save_pretrained(str(ckpt))
    rewrite_checkpoint(ckpt)
    return {
        "reproduces": "text-only checkpoint: Qwen3_5ForCausalLM / model_type qwen3_5_text, keys model.* + lm_head.weight",
        "post_processing": "Qwen3_5ForCausalLM(Qwen3_5TextConfig(...)).save_pretrained(dir); nothing else",
        "goldens": ["causal-lm", "vlm"],
    }


def build_bf16_auto(ckpt: Path, gen: torch.Generator) -> dict:
    model = micro_vlm(gen)
    model.to(torch.bfloat16).save_pretrained(str(ckpt))
    rewrite_checkpoint(ckpt)
    return {
        "reproduces": "bf16 checkpoint loaded with dtype='auto': every path lands on bf16",
        "post_processing": "model.to(torch.bfloat16).save_pretrained(dir); config.json as written",
        "goldens": ["causal-lm", "vlm"]  # image-text-to-text is bitwise equal to vlm (recorded); kept out for size,
    }


DIVERGENCE_FIXTURES = [
    ("fp16-disk", build_fp16_disk),
    ("tied-top-level", build_tied_top_level),
    ("nested-prefix", build_nested_prefix),
    ("legacy-duplicated-prefix", build_legacy_prefix),
    ("text-only-causal", build_text_only),
    ("bf16-auto", build_bf16_auto),
]


# --- loading, report, goldens ------------------------------------------------------------------------
KEY_PREFIXES = ("model.language_model.language_model.language_model.", "model.language_model.model.",
                "model.language_model.", "model.visual.", "model.", "lm_head.", "mtp.")
WARNING_CLIP = 1500


def prefix_counts(names: list[str]) -> dict:
    counts = {}
    for k in names:
        pre = next((p for p in KEY_PREFIXES if k.startswith(p)), "<other>")
        counts[pre] = counts.get(pre, 0) + 1
    return {p: counts[p] for p in (*KEY_PREFIXES, "<other>") if p in counts}


def _clip(text: str) -> str:
    """A LOAD REPORT warning, deterministic and short.

    transformers prints the table rows in set order (it changes with the Python hash seed): sort them.
    The table repeats the missing/unexpected keys, which are stored in full anyway: keep its head only.
    """
    lines = text.split("\n")
    sep = next((i for i, ln in enumerate(lines) if ln.startswith("---") and "+" in ln), None)
    if sep is not None:
        end = next((i for i in range(sep + 1, len(lines)) if not lines[i].strip()), len(lines))
        lines[sep + 1:end] = sorted(lines[sep + 1:end])
        text = "\n".join(lines)
    if len(text) <= WARNING_CLIP:
        return text
    return text[:WARNING_CLIP] + f"\n[... clipped here; {len(text)} characters in all]"


def _tensor_stats(t: torch.Tensor) -> str:
    t = t.detach().double()
    std = float(t.std()) if t.numel() > 1 else 0.0
    return f"shape={list(t.shape)} mean={float(t.mean()):.6g} std={std:.6g}"


@torch.no_grad()
def forward_dump(m, prompts_ids: list[list[int]], num_layers: int, layer_cls=None) -> tuple[dict, list]:
    """Forward of every prompt with output_hidden_states and a hook on the last decoder layer: the dump tensors
    (dump format names) and, per prompt, max |x| of each hidden state then of the raw last-layer output."""
    layer_cls = layer_cls or mq.Qwen3_5DecoderLayer
    layers = [x for x in m.modules() if isinstance(x, layer_cls)]
    assert len(layers) == num_layers, len(layers)
    norm = final_norm(m)
    captured = {}

    def hook(_mod, _args, out):
        captured["last"] = out[0] if isinstance(out, (tuple, list)) else out

    handle = layers[-1].register_forward_hook(hook)
    tensors: dict[str, torch.Tensor] = {}
    stats = []
    try:
        for k, ids in enumerate(prompts_ids):
            input_ids = torch.tensor(ids, dtype=torch.int64)
            captured.clear()
            out = m(input_ids=input_ids[None], output_hidden_states=True, use_cache=False)
            hs = out.hidden_states
            assert len(hs) == num_layers + 1, len(hs)
            raw = captured["last"]
            assert torch.equal(hs[num_layers], norm(raw)), "hidden_states[N] must be norm(last layer output)"
            tensors[f"p{k}.input_ids"] = input_ids.contiguous()
            for i, h in enumerate(hs):
                h = h[0].float().contiguous()
                assert torch.isfinite(h).all()
                tensors[f"p{k}.hidden_states.{i}"] = h
            tensors[f"p{k}.last_layer_output"] = raw[0].float().contiguous()
            if getattr(out, "logits", None) is not None:
                tensors[f"p{k}.logits"] = out.logits[0].float().contiguous()
            stats.append([float(h.abs().max()) for h in hs] + [float(raw.abs().max())])
    finally:
        handle.remove()
    return tensors, stats


def div_path(ckpt_rel: str, inv: dict, path_name: str, prompts_ids, want_golden: bool,
             layer_cls=None, keep_logits: bool | None = None) -> dict:
    _, auto_name, auto_cls = PATH_BY_NAME[path_name]
    entry = {"name": path_name, "auto_class": auto_name}
    setup_determinism()
    torch.manual_seed(DIV_INIT_SEED)
    try:
        m, info, records = load(auto_cls, ckpt_rel, attn_implementation="eager")
    except Exception as e:  # noqa: BLE001 -- recorded, this is the fact we want
        entry.update({"loaded": False, "error_type": type(e).__name__, "error": _ANSI.sub("", str(e)),
                      "golden": None, "golden_skipped_because": "from_pretrained raised"})
        return entry
    sd = m.state_dict()
    params = list(m.named_parameters())
    dtypes = sorted({str(p.dtype).replace("torch.", "") for _, p in params})
    pdtype = params[0][1].dtype
    emb = m.get_input_embeddings().weight
    lm_head = getattr(m, "lm_head", None)
    missing = sorted(info.get("missing_keys") or [])
    tied_not_on_disk = (lm_head is not None and lm_head.weight.data_ptr() == emb.data_ptr()
                        and "lm_head.weight" not in inv["names"])
    unexpected = sorted(info.get("unexpected_keys") or [])
    entry.update({
        "loaded": True,
        "class": type(m).__name__,
        "config_class": type(m.config).__name__,
        "model_type": m.config.model_type,
        "config_dtype_after_load": str(m.config.dtype).replace("torch.", ""),
        "attn_implementation": m.config._attn_implementation,
        "dtype": dtypes[0] if len(dtypes) == 1 else dtypes,
        "state_dict_tensors": len(sd),
        "named_parameters": len(params),
        "numel": sum(p.numel() for _, p in params),
        "missing_keys": missing,
        "unexpected_keys": unexpected,
        "mismatched_keys": sorted(str(x) for x in (info.get("mismatched_keys") or [])),
        "error_msgs": [str(x) for x in (info.get("error_msgs") or [])],
        "load_warnings": [_clip(r) for r in records],
        "has_lm_head": lm_head is not None,
        "lm_head_is_embedding_tensor": (lm_head.weight is emb) if lm_head is not None else None,
        "lm_head_shares_embedding_data_ptr": (lm_head.weight.data_ptr() == emb.data_ptr())
        if lm_head is not None else None,
        # derived here: checkpoint tensors neither loaded nor reported (ignore rules); a tied lm_head is
        # in the state_dict without coming from the checkpoint
        "derived_dropped_silently": len(inv["names"]) - (len(sd) - len(missing) - int(tied_not_on_disk))
        - len(unexpected),
        "first_state_dict_keys": list(sd.keys())[:3],
        "last_state_dict_keys": list(sd.keys())[-2:],
    })
    entry["tied"] = entry["lm_head_shares_embedding_data_ptr"]  # None: the class has no lm_head
    if missing:
        entry["random_init"] = {
            "torch_manual_seed": DIV_INIT_SEED,
            "note": "torch.manual_seed(seed) immediately before from_pretrained; the MISSING tensors are "
                    "transformers' _init_weights values (Rust cannot reproduce torch's RNG)",
            "missing_tensor_stats": {k: _tensor_stats(sd[k]) for k in missing if k in sd},
        }
    if want_golden:
        N = m.config.get_text_config().num_hidden_layers
        tensors, stats = forward_dump(m, prompts_ids, N, layer_cls)
        metadata = {
            "format": "hsparity.dump.v1",
            "checkpoint": ckpt_rel,
            "loading_path": path_name,
            "class": type(m).__name__,
            "dtype": DTYPE_SHORT[pdtype],
            "num_layers": str(N),
            "tool_version": f"transformers {transformers.__version__}",
        }
        out_path = Path(ckpt_rel) / "golden" / f"{path_name}.safetensors"
        # Logits are kept only where they are the point (the tied lm_head); elsewhere they
        # would double the fixture size and add nothing the hidden states do not show.
        if keep_logits is None:
            keep_logits = ckpt_rel.endswith("tied-top-level") and path_name == "image-text-to-text"
        save_safetensors(out_path, {k: v for k, v in tensors.items()
                                    if keep_logits or not k.endswith(".logits")}, metadata)
        entry["golden"] = str(out_path)
        entry["golden_dtype"] = DTYPE_SHORT[pdtype]
        # max over the pre-norm states: hidden_states[0..N-1] and the raw last-layer output
        entry["golden_max_abs_h_per_prompt"] = [round(max(r[:-2] + r[-1:]), 4) for r in stats]
        if missing:
            affected = ["p*.logits"] if missing == ["lm_head.weight"] else ["everything downstream of a missing key"]
            entry["golden_keys_from_random_init"] = affected
        entry["_tensors"] = tensors
    else:
        entry["golden"] = None
    del m
    return entry


def make_divergence_fixture(name: str, builder, prompts: list[dict], prompts_ids, tok_src: Path) -> dict:
    ckpt_rel = f"{DIV_REL}/{name}"
    ckpt = REPO / ckpt_rel
    (ckpt / "golden").mkdir(parents=True)
    setup_determinism()
    gen = torch.Generator().manual_seed(DIV_SEED + [n for n, _ in DIVERGENCE_FIXTURES].index(name))
    facts = builder(ckpt, gen)
    for fname in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tok_src / fname, ckpt / fname)
    with open(ckpt / "prompts.jsonl", "w") as f:
        for p in prompts:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    inv = checkpoint_inventory(ckpt)
    goldens = facts.pop("goldens")
    report = {
        "tool_version": f"transformers {transformers.__version__}",
        "torch_version": torch.__version__.split("+")[0],
        "fixture": name,
        "checkpoint": ckpt_rel,
        **facts,
        "load_arguments": "torch.manual_seed(%d); from_pretrained(checkpoint, output_loading_info=True, "
                          "attn_implementation='eager')  # dtype defaults to 'auto'" % DIV_INIT_SEED,
        "config_json": config_dtype_fields(ckpt),
        "checkpoint_files": checkpoint_files(ckpt),
        "checkpoint_tensors": len(inv["names"]),
        "checkpoint_dtypes": inv["dtypes"],
        "checkpoint_first_tensor": {"file": inv["first_tensor"][0], "name": inv["first_tensor"][1],
                                    "dtype": inv["first_tensor"][2]},
        # each tensor counted once, under the first (longest) prefix it has
        "checkpoint_tensors_by_prefix": prefix_counts(inv["names"]),
        "lm_head_in_checkpoint": "lm_head.weight" in inv["names"],
        "prompt_token_counts": [len(p) for p in prompts_ids],
        "paths": [],
    }
    paths = [p[0] for p in PATHS]
    for path_name in paths:
        report["paths"].append(div_path(ckpt_rel, inv, path_name, prompts_ids, path_name in goldens))
    # every golden the fixture lists must exist
    by = {p["name"]: p for p in report["paths"]}
    for g in goldens:
        assert by[g].get("golden"), (name, g, by[g].get("error"))
    # cross-path comparison of the goldens on the keys they share
    cmp = {}
    tens = {p["name"]: p.pop("_tensors") for p in report["paths"] if "_tensors" in p}
    names = [n for n in paths if n in tens]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            shared = sorted(set(tens[a]) & set(tens[b]))
            hs = [k for k in shared if ".hidden_states." in k or k.endswith(".last_layer_output")]
            lg = [k for k in shared if k.endswith(".logits")]

            def summary(keys):
                if not keys:
                    return None
                return {"bitwise_equal": all(torch.equal(tens[a][k], tens[b][k]) for k in keys),
                        "max_abs_diff": float(max((tens[a][k] - tens[b][k]).abs().max() for k in keys))}

            cmp[f"{a} vs {b}"] = {"hidden_states_and_last_layer_output": summary(hs), "logits": summary(lg)}
    report["cross_path_goldens"] = cmp
    write_json(ckpt / "golden" / "load_report.json", report)
    return report


def check_divergence_facts(reports: dict):
    """The transformers facts each fixture exists to pin down (tools/README.md, "Divergence fixtures")."""
    def by(name):
        return {p["name"]: p for p in reports[name]["paths"]}

    r = by("fp16-disk")
    assert r["causal-lm"]["dtype"] == "bfloat16", r["causal-lm"]["dtype"]
    assert r["vlm"]["dtype"] == "float16" and r["image-text-to-text"]["dtype"] == "float16"
    assert all(p["missing_keys"] == [] for p in r.values())

    r = by("tied-top-level")
    assert r["causal-lm"]["missing_keys"] == ["lm_head.weight"], r["causal-lm"]["missing_keys"]
    assert r["causal-lm"]["tied"] is False
    assert r["image-text-to-text"]["missing_keys"] == [] and r["image-text-to-text"]["tied"] is True
    assert r["vlm"]["missing_keys"] == [] and r["vlm"]["unexpected_keys"] == []
    c = reports["tied-top-level"]["cross_path_goldens"]
    assert c["causal-lm vs image-text-to-text"]["hidden_states_and_last_layer_output"]["bitwise_equal"]
    assert not c["causal-lm vs image-text-to-text"]["logits"]["bitwise_equal"]

    r = by("nested-prefix")
    n_text = reports["nested-prefix"]["checkpoint_tensors_by_prefix"]["model.language_model.language_model.language_model."]
    for p in r.values():
        assert len(p["missing_keys"]) == n_text, (p["name"], len(p["missing_keys"]))

    r = by("legacy-duplicated-prefix")
    for p in r.values():
        assert p["missing_keys"] == [], p["missing_keys"]
        assert p["unexpected_keys"] == ([] if p["name"] != "vlm" else ["lm_head.weight"]), p["unexpected_keys"]

    r = by("text-only-causal")
    assert r["causal-lm"]["class"] == "Qwen3_5ForCausalLM" and r["vlm"]["class"] == "Qwen3_5TextModel"
    assert r["image-text-to-text"]["loaded"] is False

    r = by("bf16-auto")
    assert all(p["dtype"] == "bfloat16" for p in r.values())
    c = reports["bf16-auto"]["cross_path_goldens"]
    assert all(v["hidden_states_and_last_layer_output"]["bitwise_equal"] for v in c.values()), c

    for name in ("legacy-duplicated-prefix", "text-only-causal"):
        c = reports[name]["cross_path_goldens"]["causal-lm vs vlm"]
        assert c["hidden_states_and_last_layer_output"]["bitwise_equal"], (name, c)


def make_divergence_fixtures(tok_src: Path) -> dict:
    root = REPO / DIV_REL
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    tok = Tokenizer.from_file(str(tok_src / "tokenizer.json"))
    short_ids = encode(tok, DIV_PROMPT_SHORT)
    long_ids = encode(tok, DIV_PROMPT_LONG)
    assert 8 <= len(short_ids) <= 14, len(short_ids)
    assert 65 <= len(long_ids) <= 80, len(long_ids)  # crosses the 64-token GDN chunk
    prompts = [{"text": DIV_PROMPT_SHORT}, {"text": DIV_PROMPT_LONG}]
    prompts_ids = [short_ids, long_ids]
    reports = {}
    for name, builder in DIVERGENCE_FIXTURES:
        reports[name] = make_divergence_fixture(name, builder, prompts, prompts_ids, tok_src)
    check_divergence_facts(reports)
    return reports


def print_divergence_table(reports: dict):
    log("== divergence fixtures (fixtures/divergence/<name>; dtype 'auto', eager)")
    log(f"  {'fixture':26s} {'path':19s} {'class':32s} {'dtype':9s} {'tensors':>7s} {'missing':>7s} "
        f"{'unexp':>5s} {'tied':5s} golden max|h| (p0, p1)")
    for name, rep in reports.items():
        for p in rep["paths"]:
            if not p["loaded"]:
                log(f"  {name:26s} {p['name']:19s} ERROR {p['error_type']}: {p['error'].splitlines()[0][:90]}")
                continue
            g = p.get("golden_max_abs_h_per_prompt")
            log(f"  {name:26s} {p['name']:19s} {p['class']:32s} {p['dtype']:9s} {p['state_dict_tensors']:7d} "
                f"{len(p['missing_keys']):7d} {len(p['unexpected_keys']):5d} {'-' if p['tied'] is None else str(p['tied']):5s} "
                f"{', '.join(f'{x:.3f}' for x in g) if g else '-'}")
        for pair, c in rep["cross_path_goldens"].items():
            hs, lg = c["hidden_states_and_last_layer_output"], c["logits"]
            log(f"      {pair}: hidden bitwise={hs['bitwise_equal']} max|d|={hs['max_abs_diff']:.3g}"
                + (f"; logits bitwise={lg['bitwise_equal']} max|d|={lg['max_abs_diff']:.3g}" if lg else ""))


# ------------------------------------------------------------------------------------------------
# tiny-qwen3: a dense Qwen3 (model_type qwen3) checkpoint, tied embeddings, head_dim != hidden / heads
# ------------------------------------------------------------------------------------------------
QWEN3_REL = "fixtures/tiny-qwen3"
QWEN3_SEED = SEED + 200
QWEN3_CONFIG = dict(
    vocab_size=TOKENIZER_VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=1,  # GQA, n_rep = 2
    head_dim=24,  # deliberately != hidden_size / num_attention_heads (16): q_proj is [48, 32], o_proj [32, 48]
    rms_norm_eps=1e-6,
    max_position_embeddings=256,
    tie_word_embeddings=True,
    attention_bias=False,
    eos_token_id=EOS_ID,
    rope_parameters=fc.default_rope(1e6),
)


@torch.no_grad()
def randomise_qwen3(model: torch.nn.Module, gen: torch.Generator):
    """Every parameter random. Qwen3RMSNorm is ``weight * norm(x)`` (init ones): norms ~ 1 + N(0, 0.1)
    (input/post-attention layernorms, q_norm / k_norm, final norm); embedding ~ N(0, 1); linears
    ~ N(0, 1 / fan_in), residual writers (o_proj, down_proj) damped by 0.5. A tied lm_head is the
    embedding parameter (``named_parameters`` lists it once)."""
    for name, p in model.named_parameters():
        if "norm" in name:
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1 + 1.0)
        elif name.endswith("embed_tokens.weight"):
            p.copy_(torch.randn(p.shape, generator=gen))
        elif p.dim() == 2:
            damp = 0.5 if re.search(r"(o_proj|down_proj)\.weight$", name) else 1.0
            p.copy_(torch.randn(p.shape, generator=gen) * (damp / p.shape[1] ** 0.5))
        else:
            raise AssertionError(f"unexpected parameter {name} {list(p.shape)}")


def make_qwen3_fixture(tok_src: Path) -> dict:
    ckpt_rel = QWEN3_REL
    ckpt = REPO / ckpt_rel
    shutil.rmtree(ckpt, ignore_errors=True)
    (ckpt / "golden").mkdir(parents=True)
    setup_determinism()
    gen = torch.Generator().manual_seed(QWEN3_SEED)
    model = Qwen3ForCausalLM(Qwen3Config(**QWEN3_CONFIG)).eval().float()
    randomise_qwen3(model, gen)
    assert model.lm_head.weight is model.model.embed_tokens.weight, "tie_word_embeddings=True must tie"
    model.save_pretrained(str(ckpt))
    assert not (ckpt / "model.safetensors.index.json").exists(), "expected a single model.safetensors"
    saved = checkpoint_inventory(ckpt)["names"]
    rewrite_checkpoint(ckpt)  # deterministic bytes; no key changes
    cfg_written = json.loads((ckpt / "config.json").read_text())
    for fname in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tok_src / fname, ckpt / fname)
    # Qwen2Tokenizer (what AutoTokenizer builds for model_type qwen3 with that tokenizer_class) splits on
    # the Qwen2 regex: tokenizer.json carries the same one (same vocab, merges and added tokens)
    chat_fixtures.set_pre_tokenizer_regex(ckpt / "tokenizer.json", chat_fixtures.QWEN2_REGEX)
    chat_fixtures.install_template(ckpt, "qwen3.jinja")

    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    prompts = [{"text": DIV_PROMPT_SHORT}, {"text": DIV_PROMPT_LONG}]
    prompts_ids = [encode(tok, p["text"]) for p in prompts]
    assert 8 <= len(prompts_ids[0]) <= 14 and 65 <= len(prompts_ids[1]) <= 80, [len(x) for x in prompts_ids]
    with open(ckpt / "prompts.jsonl", "w") as f:
        for p in prompts:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")

    inv = checkpoint_inventory(ckpt)
    report = {
        "tool_version": f"transformers {transformers.__version__}",
        "torch_version": torch.__version__.split("+")[0],
        "fixture": "tiny-qwen3",
        "checkpoint": ckpt_rel,
        "built_with": "Qwen3ForCausalLM(Qwen3Config(**QWEN3_CONFIG)).save_pretrained(dir); float32; weights "
                      "randomised (norms 1 + N(0, 0.1)); safetensors rewritten deterministically, keys unchanged",
        "save_pretrained_wrote_lm_head": "lm_head.weight" in saved,
        "load_arguments": "torch.manual_seed(%d); from_pretrained(checkpoint, output_loading_info=True, "
                          "attn_implementation='eager')  # dtype defaults to 'auto'" % DIV_INIT_SEED,
        "forward_arguments": "model(input_ids=ids[None], output_hidden_states=True, use_cache=False)",
        "config_json": {k: cfg_written.get(k, "<absent>") for k in (
            "architectures", "model_type", "dtype", "tie_word_embeddings", "head_dim", "hidden_size",
            "num_attention_heads", "num_key_value_heads", "rope_parameters", "rope_theta", "rms_norm_eps",
            "attention_bias", "use_sliding_window", "sliding_window", "layer_types")},
        "checkpoint_files": checkpoint_files(ckpt),
        "checkpoint_tensors": len(inv["names"]),
        "checkpoint_dtypes": inv["dtypes"],
        "checkpoint_first_tensor": {"file": inv["first_tensor"][0], "name": inv["first_tensor"][1],
                                    "dtype": inv["first_tensor"][2]},
        "checkpoint_tensors_by_prefix": prefix_counts(inv["names"]),
        "lm_head_in_checkpoint": "lm_head.weight" in inv["names"],
        "prompt_token_counts": [len(p) for p in prompts_ids],
        "paths": [],
    }
    goldens = ["causal-lm", "vlm"]
    for path_name, _, _ in PATHS:
        entry = div_path(ckpt_rel, inv, path_name, prompts_ids, path_name in goldens,
                         layer_cls=mq3.Qwen3DecoderLayer, keep_logits=True)
        report["paths"].append(entry)
    by = {p["name"]: p for p in report["paths"]}
    tens = {n: by[n].pop("_tensors") for n in goldens}
    N = QWEN3_CONFIG["num_hidden_layers"]
    # forward_dump asserts hidden_states[N] == norm(last_layer_output) bitwise; recorded here as a fact
    report["hidden_states_last_is_final_normed"] = {
        "hidden_states[N] == norm(last_layer_output) (bitwise, asserted)": True,
        "hidden_states[N] == last_layer_output": {
            n: all(torch.equal(tens[n][f"p{k}.hidden_states.{N}"], tens[n][f"p{k}.last_layer_output"])
                   for k in range(len(prompts_ids))) for n in goldens},
    }
    shared = sorted(set(tens["causal-lm"]) & set(tens["vlm"]))
    hs = [k for k in shared if ".hidden_states." in k or k.endswith(".last_layer_output")]
    report["cross_path_goldens"] = {"causal-lm vs vlm": {
        "hidden_states_and_last_layer_output": {
            "bitwise_equal": all(torch.equal(tens["causal-lm"][k], tens["vlm"][k]) for k in hs),
            "max_abs_diff": float(max((tens["causal-lm"][k] - tens["vlm"][k]).abs().max() for k in hs))},
        "logits": None,
    }}
    write_json(ckpt / "golden" / "load_report.json", report)

    # the facts this fixture pins down (transformers 5.23.0)
    assert cfg_written["model_type"] == "qwen3" and cfg_written["tie_word_embeddings"] is True
    assert cfg_written["head_dim"] == 24
    assert by["causal-lm"]["class"] == "Qwen3ForCausalLM" and by["vlm"]["class"] == "Qwen3Model"
    assert by["causal-lm"]["dtype"] == "float32" and by["vlm"]["dtype"] == "float32"
    assert by["causal-lm"]["tied"] is True and by["causal-lm"]["missing_keys"] == []
    assert by["causal-lm"]["unexpected_keys"] == [] and by["vlm"]["missing_keys"] == []
    assert by["vlm"]["unexpected_keys"] == ([] if not report["lm_head_in_checkpoint"] else ["lm_head.weight"])
    assert by["image-text-to-text"]["loaded"] is False
    assert report["cross_path_goldens"]["causal-lm vs vlm"]["hidden_states_and_last_layer_output"]["bitwise_equal"]
    for n in goldens:
        assert Path(by[n]["golden"]).exists()
    return report


def print_qwen3_summary(rep: dict):
    log("== tiny-qwen3 (fixtures/tiny-qwen3; dtype 'auto', eager)")
    log("config:", json.dumps(QWEN3_CONFIG))
    log("save_pretrained wrote lm_head.weight:", rep["save_pretrained_wrote_lm_head"],
        "| checkpoint tensors:", rep["checkpoint_tensors"], "| prompt tokens:", rep["prompt_token_counts"])
    for p in rep["paths"]:
        if not p["loaded"]:
            log(f"  {p['auto_class']:28s} ERROR {p['error_type']}: {p['error'].splitlines()[0][:100]}")
            continue
        log(f"  {p['auto_class']:28s} -> {p['class']:18s} {p['config_class']}({p['model_type']}) dtype={p['dtype']} "
            f"tensors={p['state_dict_tensors']} numel={p['numel']} missing={p['missing_keys']} "
            f"unexpected={p['unexpected_keys']} tied={p['tied']} max|h|={p.get('golden_max_abs_h_per_prompt')}")
    log("  hidden_states[N]:", json.dumps(rep["hidden_states_last_is_final_normed"]))
    log("  cross-path:", json.dumps(rep["cross_path_goldens"]))


# ------------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------------
def main():
    os.chdir(REPO)
    if transformers.__version__ != EXPECTED_TRANSFORMERS:
        sys.exit(f"need transformers {EXPECTED_TRANSFORMERS}, have {transformers.__version__}")
    transformers.logging.set_verbosity_warning()
    transformers.logging.disable_progress_bar()
    setup_determinism()

    ckpt = REPO / CKPT_REL
    shutil.rmtree(ckpt, ignore_errors=True)
    (ckpt / "golden").mkdir(parents=True)

    # 1. tokenizer
    tok = train_tokenizer()
    tok.save(str(ckpt / "tokenizer.json"), pretty=True)
    write_json(ckpt / "tokenizer_config.json", chat_fixtures.qwen_tokenizer_config(
        ckpt / "tokenizer.json", TEXT_CONFIG["max_position_embeddings"]))
    chat_fixtures.install_template(ckpt, "qwen3_5.jinja")
    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))  # what the Rust side reads
    vocab = tok.get_vocab_size()

    # 2. prompts
    short_ids = encode(tok, PROMPT_SHORT)
    long_ids = encode(tok, PROMPT_LONG)
    assert 8 <= len(short_ids) <= 15, len(short_ids)
    assert len(long_ids) > 64 and len(long_ids) % 64 != 0 and 90 <= len(long_ids) <= 110, len(long_ids)
    # An exact-chunk (64-token) prompt used to be here; it was dropped to keep fixtures/
    # under 5 MB. The Rust tests cover T = 64 and 128 by comparing chunked and recurrent.
    prompts = [{"text": PROMPT_SHORT}, {"text": PROMPT_LONG}]
    with open(ckpt / "prompts.jsonl", "w") as f:
        for p in prompts:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    prompts_ids = [short_ids, long_ids]

    # 3. checkpoint
    build_checkpoint(ckpt, vocab)

    # 4. load report
    report = load_report(ckpt)
    write_json(ckpt / "golden" / "load_report.json", report)
    by = {p["name"]: p for p in report["paths"]}
    assert by["vlm"]["unexpected_keys"] == ["lm_head.weight"], by["vlm"]["unexpected_keys"]
    for p in report["paths"]:
        assert p["missing_keys"] == [], p
        assert not any("mtp" in r for r in p["load_warnings"]), p["load_warnings"]
        if p["name"] != "vlm":
            assert p["unexpected_keys"] == [] and p["load_warnings"] == [], p

    # 5. goldens
    results = {}
    for path_name, _, auto_cls in PATHS:
        results[path_name] = golden(path_name, auto_cls, prompts_ids, ckpt / "golden" / f"{path_name}.safetensors")
    ref = results["causal-lm"]["tensors"]
    for other in ("vlm", "image-text-to-text"):
        for key, t in results[other]["tensors"].items():
            assert torch.equal(t, ref[key]), f"{other}:{key} differs from causal-lm"

    # 5b. tools/dump_hidden_states.py, the user-facing dump script, on the same
    #     checkpoint (short prompt only, to keep fixtures small): tests/diff.rs
    #     checks `hsparity diff` finds it clean against hsparity's own dump.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import dump_hidden_states as dhs  # noqa: E402  (tools/ sibling)

    m_vlm, _, _ = load(AutoModel, CKPT_REL, dtype=torch.float32, attn_implementation="eager")
    save_safetensors(ckpt / "golden" / "py-dump-vlm.safetensors", dhs.dump(m_vlm, [prompts_ids[0]]),
                     dhs.metadata(m_vlm, CKPT_REL, "AutoModel"))
    del m_vlm

    # 6. GDN kernels
    gdn = gdn_golden(ckpt / "golden" / "gdn_kernels.safetensors")
    decay = decay_stats(prompts_ids)

    # 7. divergence fixtures (micro checkpoints, one per loading-path divergence source)
    div_reports = make_divergence_fixtures(ckpt)

    # 8. tiny-qwen3: dense Qwen3 checkpoint (tied embeddings, head_dim 24), built last so that it
    #     cannot disturb the RNG state of anything above
    qwen3_report = make_qwen3_fixture(ckpt)

    # 9. chat templates: toy templates into the toy pairs, goldens of apply_chat_template and of the
    #     benchmark prompt sets (fixtures/chat/), z-lab's shuffle permutations (data/prompt-sets/)
    chat_fixtures.main()

    # 10. summary
    log("== tiny-qwen3_5")
    log("text_config:", json.dumps(TEXT_CONFIG))
    log("vision_config:", json.dumps(VISION_CONFIG))
    log("prompt token counts:", [len(p) for p in prompts_ids])
    for p in report["paths"]:
        log(f"  {p['auto_class']:28s} -> {p['class']:32s} {p['config_class']}({p['model_type']}) "
            f"tensors={p['state_dict_tensors']} numel={p['numel']} dtype={p['dtype']} "
            f"missing={p['missing_keys']} unexpected={p['unexpected_keys']}")
    log("checkpoint tensors:", report["checkpoint_tensors"], report["checkpoint_tensors_by_prefix"])
    log("per-layer max|h| (causal-lm; hidden_states 0..N, then last_layer_output), per prompt:")
    for k, row in enumerate(results["causal-lm"]["max_abs"]):
        log(f"  p{k}: " + " ".join(f"{x:.2f}" for x in row))
    log("all three loading paths bitwise identical on shared keys: True")
    log("GDN kernels:", json.dumps(gdn))
    log("model decay stats (long prompt):", json.dumps(decay))
    print_divergence_table(div_reports)
    print_qwen3_summary(qwen3_report)
    log("files:")
    total = 0
    for f in sorted((REPO / "fixtures").rglob("*")):
        if f.is_file():
            total += f.stat().st_size
            log(f"  {f.relative_to(REPO)}  {f.stat().st_size}  {hashlib.sha256(f.read_bytes()).hexdigest()[:16]}")
    log(f"fixtures/ total: {total} bytes ({total / 2**20:.2f} MiB)")


if __name__ == "__main__":
    main()
