#!/usr/bin/env python3
"""Train a tiny Qwen3.5 target + DFlash v1 drafter pair and write ``fixtures/toy-pair/``.

CI never runs this script: its outputs are committed and the Rust tests only read them.

How to run (from the repository root, CPU only, about 10-13 minutes on 2 cores):

    .venv/bin/pip install -r tools/requirements.txt      # dflash==0.1.0 needs --no-deps, see tools/README.md
    .venv/bin/python tools/train_toy_pair.py              # train + evaluate + write everything
    .venv/bin/python tools/train_toy_pair.py --eval-only  # re-run only the evaluation / golden part on the
                                                          # committed target + drafter (byte-identical output)

Deterministic: fixed seeds, ``torch.set_num_threads(1)`` (see THREADS), ``torch.use_deterministic_algorithms(True)``,
fixed step counts (never time-based stopping), safetensors written byte-for-byte deterministically
(``make_fixtures.save_safetensors``). The script refuses transformers != 5.23.0 or dflash != 0.1.0.

What it builds
==============

Corpus (``make_sample``): five synthetic families, every sample is one line that starts with a header
that fully determines the rest, and runs on for >= 140 characters (training crops 128):

    count 347: 347 348 349 350 ...          count up from s (s < 700)
    walk q 2: q s u w y a c ...             letters from c in steps of k (1..3), wrapping z -> a
    say zorb: zorb zorb zorb ...            repeat a 2..5-letter word
    pair ox: ox1 ox2 ox3 ...                word + counter from 1
    fizz 58: 58 59 fizzbuzz 61 62 fizz ...  FizzBuzz from s (s < 600)

There is no end-of-text in the corpus: a continuation never stops within max_new_tokens, so the
generated lengths are deterministic. Held-out parameters (HELD_OUT) never occur as training headers;
the eval prompts are the first 12..40 characters of held-out samples.

Tokenizer (``tokenizer.json``): character level. ``models.BPE`` with one token per character and no
merges, no normalizer, no pre-tokenizer (so no regex: the Rust ``tokenizers`` crate gives the same ids
by construction; also checked), ``decoders.Fuse``. Ids: 0 ``<|endoftext|>`` (special, never used),
1 ``<|MASK|>`` (special, the DFlash ``mask_token_id``, never in the corpus), then CHARS in order.
Encode with or without special tokens gives the same ids (no post-processor).

``fixtures/toy-pair/target/``: ``Qwen3_5ForConditionalGeneration`` (model_type qwen3_5, VLM layout)
written by ``model.to(torch.bfloat16).save_pretrained`` (config.json as transformers writes it: top-level
``dtype: bfloat16``), one ``model.safetensors`` rewritten deterministically, plus ``tokenizer.json`` and a
minimal ``tokenizer_config.json``, and ``chat_template.jinja``: a copy of ``tools/chat_templates/toy.jinja``, a TOY
template in the tokenizer's alphabet that keeps the Qwen3.5 template's structure (its goldens: ``tools/chat_fixtures.py``,
``fixtures/chat/toy-pair*.json``). Text config TEXT_CONFIG, vision tower VISION_CONFIG (random, never
trained). The language model is trained with the causal-LM loss (AdamW) on the corpus in float32.

``fixtures/toy-pair/drafter/``: DFlash v1 drafter (``dflash.DFlashDraftModel`` of the PyPI ``dflash`` 0.1.0),
``config.json`` (model_type qwen3, architectures [DFlashDraftModel], DRAFT_CONFIG) and ``model.safetensors``
(bf16, tensor names exactly DFlashDraftModel's state_dict: fc.weight, hidden_norm.weight, layers.{i}.*,
norm.weight; no embed_tokens, no lm_head). Trained with the SpecForge DFlash recipe on
features of the *saved* target loaded through ``AutoModelForCausalLM`` in float32 (frozen):
``hidden_states[L+1]`` for L in target_layer_ids, concatenated; random anchors p (x_{p+1} real); block
``[x_p, M x (B-1)]`` embedded by the target embedding; context = target features of positions < p
(strictly); bidirectional inside the block; no attention to other blocks; CE on x_{p+k}, k = 1..B-1 with
weights exp(-(k-1)/GAMMA), normalised; logits through the target lm_head.

``fixtures/toy-pair/prompts.jsonl``: the eval prompts, ``{"text": ...}`` per line (ids: tokenizer, no specials).

``fixtures/toy-pair/golden/reference_tau.json``: the reference acceptance lengths. Per path, per prompt, at
temperature 0, block size B = 8, max_new_tokens 64, greedy draft, the GitHub-main DFlash loop
(z-lab/dflash main) with the end rule "full blocks every round, record a+1 per round, loop while
start < prompt_len + max_new_tokens", no stop token, and a *full re-forward of the target each round*
(transformers' Qwen3.5 linear-attention cache cannot be cropped):

    prefill: target(prompt) -> out[N] = argmax(logits[N-1]); ctx = taps of positions 0..N-1
    round:   draft = drafter(target_hidden = taps of ALL positions < start (no draft cache),
                             noise = target_embed([out[start], M x 7]), position_ids = 0..start+7)
             drafts = argmax(compute_logits(draft[1:], target lm_head))      (first max index)
             verify: target(out[0:start] + block) full forward (no cache), post = argmax(logits[start..start+7])
             a = leading matches, commit, start += a + 1, record a + 1; taps for the next round from
             this verify forward.

Target: ``from_pretrained(target, dtype="auto", attn_implementation="eager")`` = bf16; drafter:
``DFlashDraftModel.from_pretrained(drafter, dtype=torch.bfloat16)`` (as the z-lab benchmark runs it).
Paths: ``causal-lm`` (AutoModelForCausalLM: taps, logits); ``vlm`` (AutoModel = Qwen3_5Model: taps and
final hidden states from it, logits = causal-lm lm_head on them: a cross run). Every committed token is
checked against the plain greedy trajectory (full re-forward per token, causal-lm). Recorded per path:
per prompt trajectory (the 64 new tokens), acceptance lengths per round, tau; tau_macro (mean of
per-prompt means), tau_pooled (total accepted / total rounds), histogram over 1..=B. Also:

* ``ddtree8_same_rounds``: per DFlash round, what DDTree with budget 8 accepts from the same draft
  logits (best-first tree over per-depth top-k log_softmax, heap key (-logw, rank tuple) as liranringel/
  ddtree; accepted = 1 + longest root path matching the greedy trajectory).
* ``ddtree8``: a separate DDTree-8 loop (its own rounds, start += accepted length, same full re-forward
  features, tree verified against the greedy trajectory, which at T = 0 equals the tree verify).
* ``drafter_f32``: the causal-lm DFlash loop with the drafter run in float32 (weights, taps, noise
  embedding and lm_head upcast from bf16).

``fixtures/toy-pair/golden/drafter_forward.safetensors``: ``DFlashDraftModel.forward`` in float32 (weights
loaded in f32 from the bf16 files) without cache and without mask, for the trained drafter
(prefix ``trained.``) and a random drafter (prefix ``random.``, config + bf16 weights in
``golden/random-drafter/``: 2 layers, 4 heads / 2 kv heads, head_dim 24 (!= hidden / heads), rope_theta 1e6, rms_norm_eps 1e-5,
intermediate 16, 3 taps [0, 1, 2], block_size 6). Keys, case i = 0, 1, 2:

    {trained,random}.case{i}.target_hidden    F32 [C, K*H]  taps from the causal-lm bf16 path (exact in f32)
    {trained,random}.case{i}.block_ids        I64 [B]       [root, M, ..., M]
    {trained,random}.case{i}.position_ids     I64 [C + B]   context positions, then start..start+B-1
    {trained,random}.case{i}.noise_embedding  F32 [B, H]    target embed_tokens rows of block_ids (f32)
    {trained,random}.case{i}.hidden           F32 [B, H]    forward output (final-normed)
    {trained,random}.case{i}.logits           F32 [B, V]    compute_logits(hidden, target lm_head in f32);
                                                            rows 1..B-1 are the drafts (row 0 is unused)

Cases: 0 = first round of prompt 0 (C = prompt length, positions 0..); 1 = the third round of prompt 11
(C = start, all rows of positions < start); 2 = a window: only the 12 context rows of positions
start-12..start-1 (position_ids do not start at 0). ``__metadata__`` describes them.

``fixtures/toy-pair/golden/reference_generate_gdn_crop.json`` (also alone: ``--gdn-crop-only``, ~10 s): z-lab's own
loop ``dflash.model.dflash_generate`` (the 0.1.0 wheel) on this Qwen3.5 pair, which is NOT lossless on transformers
5.23.0: after each verification ``_crop_to`` calls ``DynamicCache.crop``, whose ``LinearAttentionCacheLayerMixin.crop``
cuts the Gated DeltaNet conv state back to the kept tokens but leaves the recurrent state over every verified token
(rejected drafts included), and does not raise although ``is_croppable`` is False. Two sets: ``held_out`` (the 15
prompts, 64 new tokens, bf16 drafter) and ``noise`` (GDN_CROP_NOISE seeded random strings, GDN_CROP_NOISE_NEW new
tokens, the drafter in float32 so that the many rejected drafts, which with this crop change the output, are not
decided by exact bf16 ties). Per prompt: ``input_ids``, ``output_ids``, ``greedy_ids`` (full re-forward),
``first_departure``, ``acceptance_lengths`` (the package's ``produced``), ``tau``; per set τ macro / pooled and
``departing_prompts`` (asserted >= 2 for ``noise``); ``crop_facts`` (the crop measured on one block: conv state equal
to the kept prefix's, recurrent state not).

``--family qwen3`` (``fixtures/toy-pair-qwen3/``)
===============================================

The same kind of pair on a **dense Qwen3** target, so that z-lab's own loop ``dflash.model.dflash_generate`` (which
crops the target's KV cache: fine for Qwen3, wrong for Qwen3.5) can be the reference:

    .venv/bin/python tools/train_toy_pair.py --family qwen3              # train + evaluate (~8-10 min)
    .venv/bin/python tools/train_toy_pair.py --family qwen3 --eval-only  # golden/ + prompts from the saved weights

* same corpus, tokenizer (``target/tokenizer.json``, ``tokenizer_config.json``), chat template and ``prompts.jsonl`` as the
  qwen3_5 pair (asserted byte-equal when ``fixtures/toy-pair/`` is present);
* ``target/``: ``Qwen3ForCausalLM`` (model_type qwen3), QWEN3_TARGET_CONFIG (untied lm_head), trained Q3_T_STEPS
  steps with the target recipe above, saved by ``model.to(torch.bfloat16).save_pretrained`` (single
  ``model.safetensors``, rewritten deterministically) + ``generation_config.json``;
* ``drafter/``: DRAFT_CONFIG trained by ``train_drafter`` on the Qwen3 target's taps (no random drafter, no
  drafter_forward golden);
* ``golden/reference_generate.json``: per prompt, ``dflash.model.dflash_generate(drafter, target, ids[None],
  max_new_tokens=64, stop_token_ids=None, temperature=0.0, return_stats=True)`` with the target from
  ``AutoModelForCausalLM.from_pretrained(target, attn_implementation="eager")`` (dtype auto = bf16) and the
  drafter from ``DFlashDraftModel.from_pretrained(drafter, dtype=torch.bfloat16)``. Keys: ``format``, ``tools``,
  ``settings`` (incl. ``end_rule``: WHEEL_END_RULE), ``training``, ``prompts`` (family, num_tokens, text,
  target_continuation, matches_pattern, first_mismatch), ``class``, ``dtype``, ``tau_macro``, ``tau_pooled``,
  ``rounds``, ``histogram``, ``histogram_fraction``, ``dflash_equals_greedy``,
  ``generate_equals_full_reforward_greedy``, ``per_prompt`` (prompt, num_tokens, ``output_ids`` = the 64 generated
  ids, ``greedy_ids`` = the target's greedy continuation by full re-forward, ``acceptance_lengths`` = the
  package's ``produced`` per round, ``tau``);
* ``golden/reference_generate_short.json``: the same call for the short generations SHORT_NEW (where the wheel's
  last blocks shrink), per max_new_tokens per prompt ``output_ids`` and ``acceptance_lengths`` (asserted: lengths
  sum to N - 1, output equals the first N greedy ids). Asserted for the 64-token run: output_ids == greedy_ids == ``generate(do_sample=False)``
  for every prompt, sum(acceptance_lengths) = 63, tau_macro >= 3, sizes (target < 350 KB, drafter < 150 KB,
  folder < 550 KB).
"""
from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import math
import os
import random
import shutil
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from tokenizers import Tokenizer, decoders, models  # noqa: E402

import transformers  # noqa: E402
from transformers import AutoModel, AutoModelForCausalLM, Qwen3Config, Qwen3_5Config  # noqa: E402
from transformers import Qwen3_5ForConditionalGeneration  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fixture_configs as fc  # noqa: E402  (tools/ sibling: config pieces shared with the other generators)
from make_fixtures import save_safetensors, write_json  # noqa: E402

import dflash  # noqa: E402
from dflash.model import DFlashDraftModel, extract_context_feature  # noqa: E402

warnings.filterwarnings("ignore")

REPO = Path(__file__).resolve().parent.parent
OUT_REL = "fixtures/toy-pair"
SEED = 20260301
EXPECTED_TRANSFORMERS = "5.23.0"
EXPECTED_DFLASH = "0.1.0"

# ------------------------------------------------------------------------------------------------
# Tokenizer / corpus
# ------------------------------------------------------------------------------------------------
EOT, MASK = "<|endoftext|>", "<|MASK|>"
CHARS = " :0123456789abcdefghijklmnopqrstuvwxyz"
LETTERS = "abcdefghijklmnopqrstuvwxyz"
VOCAB = [EOT, MASK] + list(CHARS)
CHAR_ID = {c: i for i, c in enumerate(VOCAB)}
MASK_ID = CHAR_ID[MASK]
SEQ = 128  # training crop
MIN_CHARS = 140

HELD_OUT = {
    "count": [347, 512, 88],
    "walk": [("q", 1), ("e", 2), ("w", 3)],
    "say": ["zorb", "lum", "kite"],
    "pair": ["ox", "tam", "j"],
    "fizz": [101, 233, 58],
}
# (family, held-out index, prompt length in characters = tokens)
EVAL_PROMPTS = [
    ("count", 0, 18), ("walk", 0, 16), ("say", 0, 19), ("pair", 0, 17),
    ("count", 1, 27), ("walk", 1, 22), ("say", 1, 14), ("pair", 1, 30),
    ("count", 2, 36), ("walk", 2, 40), ("say", 2, 33), ("pair", 2, 12),
    ("fizz", 0, 20), ("fizz", 1, 28), ("fizz", 2, 35),
]


def family_text(family: str, param) -> str:
    if family == "count":
        head, items, i = f"count {param}: ", [], param
        while len(head) + len(" ".join(items)) < MIN_CHARS:
            items.append(str(i))
            i += 1
    elif family == "walk":
        c, k = param
        head, items, j = f"walk {c} {k}: ", [], LETTERS.index(c)
        while len(head) + len(" ".join(items)) < MIN_CHARS:
            items.append(LETTERS[j % 26])
            j += k
    elif family == "say":
        head, items = f"say {param}: ", []
        while len(head) + len(" ".join(items)) < MIN_CHARS:
            items.append(param)
    elif family == "pair":
        head, items, i = f"pair {param}: ", [], 1
        while len(head) + len(" ".join(items)) < MIN_CHARS:
            items.append(f"{param}{i}")
            i += 1
    elif family == "fizz":
        head, items, i = f"fizz {param}: ", [], param
        while len(head) + len(" ".join(items)) < MIN_CHARS:
            items.append("fizzbuzz" if i % 15 == 0 else "fizz" if i % 3 == 0 else "buzz" if i % 5 == 0 else str(i))
            i += 1
    else:
        raise ValueError(family)
    return head + " ".join(items)


FAMILIES = ["count", "walk", "say", "pair", "fizz"]


def random_param(rng: random.Random, family: str):
    while True:
        if family == "count":
            p = rng.randrange(0, 700)
        elif family == "walk":
            p = (rng.choice(LETTERS), rng.randint(1, 3))
        elif family == "say":
            p = "".join(rng.choice(LETTERS) for _ in range(rng.randint(2, 5)))
        elif family == "pair":
            p = "".join(rng.choice(LETTERS) for _ in range(rng.randint(1, 3)))
        else:
            p = rng.randrange(1, 600)
        if p not in HELD_OUT[family]:
            return p


def make_sample(rng: random.Random) -> str:
    fam = FAMILIES[rng.randrange(len(FAMILIES))]
    return family_text(fam, random_param(rng, fam))[:SEQ]


def ids_of(text: str) -> list[int]:
    return [CHAR_ID[c] for c in text]


def build_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(VOCAB)}, merges=[], unk_token=None,
                               fuse_unk=False, byte_fallback=False))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([EOT, MASK])
    assert tok.get_vocab_size() == len(VOCAB)
    return tok


def encode(tok: Tokenizer, text: str) -> list[int]:
    a = tok.encode(text, add_special_tokens=False).ids
    assert a == tok.encode(text, add_special_tokens=True).ids == ids_of(text), text
    assert tok.decode(a) == text
    return a


# ------------------------------------------------------------------------------------------------
# Model configs
# ------------------------------------------------------------------------------------------------
LAYER_TYPES = fc.hybrid_layer_types(linear_per_full=1, blocks=2)
TEXT_CONFIG = fc.qwen3_5_text_config(
    vocab_size=len(VOCAB),
    hidden_size=64,
    intermediate_size=128,
    layer_types=LAYER_TYPES,
    # rotary dim 16 * 0.25 = 4 -> 2 frequencies; mrope_section sums to 2
    attention=fc.attention_fields(heads=4, kv_heads=2, head_dim=16),
    gated_deltanet=fc.gated_deltanet_fields(key_heads=2, value_heads=4, head_dim=16),
    max_position_embeddings=512,
    eos_token_id=0,
    rope_parameters=fc.interleaved_mrope([1, 1, 0]),
)
VISION_CONFIG = dict(fc.MICRO_VISION_CONFIG, out_hidden_size=64)  # the micro tower, projecting to hidden 64

BLOCK = 8
GAMMA = 4.0
TAPS = [1, 2]
DRAFT_CONFIG = dict(
    architectures=["DFlashDraftModel"],
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    attention_bias=False,
    max_position_embeddings=512,
    rope_parameters=fc.default_rope(10000.0),
    vocab_size=len(VOCAB),
    tie_word_embeddings=False,
    layer_types=["full_attention"] * 2,
    num_target_layers=len(LAYER_TYPES),
    block_size=BLOCK,
    dflash_config=dict(target_layer_ids=TAPS, mask_token_id=MASK_ID, block_size=BLOCK),
)
RANDOM_DRAFT_CONFIG = dict(
    DRAFT_CONFIG,
    intermediate_size=16,
    head_dim=24,
    rms_norm_eps=1e-5,
    rope_parameters=fc.default_rope(1e6),
    block_size=6,
    dflash_config=dict(target_layer_ids=[0, 1, 2], mask_token_id=MASK_ID, block_size=6),
)

# training hyper-parameters (fixed step counts: deterministic)
T_STEPS, T_BATCH, T_LR = 1300, 32, 3e-3
D_SEQS, D_STEPS, D_BATCH, D_ANCHORS, D_LR = 1024, 2500, 16, 12, 3e-3
MAX_NEW = 64
DDTREE_BUDGET = 8

# --family qwen3: a dense Qwen3 target (Qwen3ForCausalLM), same corpus / tokenizer / drafter recipe
OUT_REL_QWEN3 = "fixtures/toy-pair-qwen3"
QWEN3_TARGET_CONFIG = dict(
    vocab_size=len(VOCAB),
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-6,
    max_position_embeddings=512,
    tie_word_embeddings=False,
    eos_token_id=0,
    rope_parameters=fc.default_rope(10000.0),
)
Q3_T_STEPS = 2000
WHEEL_END_RULE = ("PyPI dflash 0.1.0 wheel: loop while start + 1 < max_length (max_length = N + max_new_tokens); "
                  "verify size = min(B, max_length - start) (shortened blocks in the last rounds; no draft forward "
                  "when it is 1); record produced = min(a + 1, max_length - start - 1) and start += produced; "
                  "output = out[:min(start + 1, max_length)], so sum(acceptance_lengths) = max_new_tokens - 1; "
                  "stop_token_ids None")


# ------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------
T0 = time.time()
# One thread: on a shared 2-core machine, 2 OpenMP threads on these tiny ops are 1-20x slower than one
# (barrier spinning while the other core is busy), and one thread is reproducible on any machine.
THREADS = 1


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


def setup_determinism(seed: int):
    torch.manual_seed(seed)
    torch.set_num_threads(THREADS)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.use_deterministic_algorithms(True)


def lr_at(step: int, total: int, peak: float, warmup: int = 30) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    prog = (step - warmup) / max(1, total - warmup)
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * prog)))


def rewrite_safetensors(path: Path, dtype=None):
    from safetensors import safe_open
    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
    sd = {k: v.clone() for k, v in load_file(str(path)).items()}
    if dtype is not None:
        sd = {k: v.to(dtype) for k, v in sd.items()}
    save_safetensors(path, sd, meta)


# ------------------------------------------------------------------------------------------------
# 1. target
# ------------------------------------------------------------------------------------------------
def train_lm(model, body, params, steps: int, log_every: int, target_dir: Path) -> dict:
    """The target recipe: next-token cross entropy on corpus samples through ``body`` (the decoder) and
    ``model.lm_head``, AdamW with the warm-up/cosine schedule, grad clip 1.0; then saved bf16 in one
    ``model.safetensors`` (rewritten deterministically). Returns the training facts."""
    opt = torch.optim.AdamW(params, lr=T_LR, betas=(0.9, 0.98), weight_decay=0.0)
    rng = random.Random(SEED)
    losses = []
    t = time.time()
    for step in range(steps):
        x = torch.tensor([ids_of(make_sample(rng)) for _ in range(T_BATCH)])
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, T_LR)
        h = body(input_ids=x, use_cache=False).last_hidden_state
        logits = model.lm_head(h[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())
        if step % log_every == 0 or step == steps - 1:
            log(f"target step {step:4d} loss {loss.item():.4f} (avg50 {sum(losses[-50:]) / len(losses[-50:]):.4f})")
    secs = time.time() - t
    model.eval()
    model.to(torch.bfloat16).save_pretrained(str(target_dir))
    files = sorted(p.name for p in target_dir.glob("*.safetensors"))
    assert files == ["model.safetensors"], files
    rewrite_safetensors(target_dir / "model.safetensors")
    return {"steps": steps, "batch": T_BATCH, "seq": SEQ, "lr": T_LR, "seconds": round(secs, 1),
            "final_loss_avg50": round(sum(losses[-50:]) / 50, 4), "loss_first": round(losses[0], 4)}


def train_target(target_dir: Path) -> dict:
    setup_determinism(SEED)
    cfg = Qwen3_5Config(text_config=dict(TEXT_CONFIG), vision_config=dict(VISION_CONFIG), tie_word_embeddings=False)
    model = Qwen3_5ForConditionalGeneration(cfg).float()
    model.train()
    params = [p for n, p in model.named_parameters() if not n.startswith("model.visual.")]
    return train_lm(model, model.model.language_model, params, T_STEPS, 50, target_dir)


def train_target_qwen3(target_dir: Path) -> dict:
    """--family qwen3: the same recipe as train_target on a dense Qwen3ForCausalLM (Q3_T_STEPS steps)."""
    from transformers import Qwen3ForCausalLM
    setup_determinism(SEED)
    model = Qwen3ForCausalLM(Qwen3Config(**QWEN3_TARGET_CONFIG)).float()
    model.train()
    return {"class": "Qwen3ForCausalLM",
            **train_lm(model, model.model, list(model.parameters()), Q3_T_STEPS, 100, target_dir)}


# ------------------------------------------------------------------------------------------------
# 2. drafter training
# ------------------------------------------------------------------------------------------------
def target_features(model, ids: torch.Tensor, taps) -> torch.Tensor:
    out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    return extract_context_feature(out.hidden_states, taps)


def train_drafter(target_dir: Path, drafter_dir: Path) -> dict:
    setup_determinism(SEED + 1)
    tgt = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32, attn_implementation="eager").eval()
    for p in tgt.parameters():
        p.requires_grad_(False)
    embed, lm_head = tgt.get_input_embeddings(), tgt.lm_head
    rng = random.Random(SEED + 1)
    data = torch.tensor([ids_of(make_sample(rng)) for _ in range(D_SEQS)])
    t = time.time()
    with torch.no_grad():
        feats = torch.cat([target_features(tgt, data[i:i + 64], TAPS) for i in range(0, D_SEQS, 64)])
    feat_secs = time.time() - t
    log(f"drafter features {tuple(feats.shape)} in {feat_secs:.1f}s")

    cfg = Qwen3Config(**DRAFT_CONFIG)
    draft = DFlashDraftModel(cfg).float()
    draft.train()
    opt = torch.optim.AdamW(draft.parameters(), lr=D_LR, betas=(0.9, 0.98), weight_decay=0.0)
    gen = torch.Generator().manual_seed(SEED + 2)
    B, S, n = BLOCK, SEQ, D_ANCHORS
    kw = torch.exp(-(torch.arange(1, B) - 1) / GAMMA)  # weights for k = 1..B-1
    losses, accs = [], []
    t = time.time()
    for step in range(D_STEPS):
        idx = torch.randint(0, D_SEQS, (D_BATCH,), generator=gen)
        x, c = data[idx], feats[idx]
        # anchors: p in [1, S-2] (x_{p+1} real), sorted
        p = torch.stack([torch.randperm(S - 2, generator=gen)[:n] + 1 for _ in range(D_BATCH)]).sort(-1).values
        blk = torch.full((D_BATCH, n, B), MASK_ID, dtype=torch.long)
        blk[:, :, 0] = x.gather(1, p)
        lab_pos = p[:, :, None] + torch.arange(1, B)  # [b, n, B-1]
        valid = lab_pos < S
        labels = x.gather(1, lab_pos.clamp(max=S - 1).view(D_BATCH, -1)).view(D_BATCH, n, B - 1)
        noise = embed(blk.view(D_BATCH, n * B))
        pos = torch.cat([torch.arange(S).expand(D_BATCH, S), (p[:, :, None] + torch.arange(B)).view(D_BATCH, n * B)], 1)
        qp = p.repeat_interleave(B, dim=1)  # anchor of every query row
        qb = torch.arange(n).repeat_interleave(B)
        ctx_vis = torch.arange(S)[None, None, :] < qp[:, :, None]  # [b, nB, S]
        blk_vis = (qb[:, None] == qb[None, :]).expand(D_BATCH, n * B, n * B)
        mask = torch.cat([ctx_vis, blk_vis], -1)[:, None]
        for g in opt.param_groups:
            g["lr"] = lr_at(step, D_STEPS, D_LR)
        hid = draft(position_ids=pos, attention_mask=mask, noise_embedding=noise, target_hidden=c)
        logits = lm_head(hid.view(D_BATCH, n, B, -1)[:, :, 1:])  # [b, n, B-1, V]
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none").view_as(labels)
        w = kw * valid
        loss = (ce * w).sum() / w.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        accs.append(((logits.argmax(-1) == labels) & valid).float().sum().item() / valid.sum().item())
        if step % 100 == 0 or step == D_STEPS - 1:
            log(f"drafter step {step:4d} loss {loss.item():.4f} acc {accs[-1]:.3f} "
                f"(avg50 {sum(losses[-50:]) / len(losses[-50:]):.4f} / {sum(accs[-50:]) / len(accs[-50:]):.3f})")
    secs = time.time() - t
    draft.eval()
    save_drafter(draft, drafter_dir)
    return {"steps": D_STEPS, "batch_seqs": D_BATCH, "anchors_per_seq": n, "sequences": D_SEQS, "lr": D_LR,
            "gamma": GAMMA, "seconds": round(secs, 1), "feature_seconds": round(feat_secs, 1),
            "final_loss_avg50": round(sum(losses[-50:]) / 50, 4), "final_acc_avg50": round(sum(accs[-50:]) / 50, 4),
            "loss_first": round(losses[0], 4)}


def save_drafter(draft: DFlashDraftModel, out: Path):
    out.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in draft.state_dict().items()}
    assert not any("embed" in k or "lm_head" in k or "rotary" in k for k in sd), sorted(sd)
    save_safetensors(out / "model.safetensors", sd, {"format": "pt"})
    cfg = draft.config.to_dict()
    cfg.pop("transformers_version", None)
    cfg["dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


@torch.no_grad()
def make_random_drafter(out: Path):
    cfg = Qwen3Config(**RANDOM_DRAFT_CONFIG)
    d = DFlashDraftModel(cfg).float()
    gen = torch.Generator().manual_seed(SEED + 3)
    for name, p in d.named_parameters():
        if name.endswith(("q_norm.weight", "k_norm.weight")):
            p.copy_(1.5 + 0.5 * torch.randn(p.shape, generator=gen))  # sharp, non-uniform attention
        elif "norm" in name:
            p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
        else:
            p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
    save_drafter(d, out)


# ------------------------------------------------------------------------------------------------
# 3. evaluation
# ------------------------------------------------------------------------------------------------
class Path_:
    """A loading path of the target: taps + final-normed hidden states + logits for a full sequence."""

    def __init__(self, name, model, lm_head, taps):
        self.name, self.model, self.lm_head, self.taps = name, model, lm_head, taps
        self.cls = type(model).__name__

    @torch.no_grad()
    def forward(self, ids: list[int], all_layers=False):
        x = torch.tensor([ids])
        out = self.model(input_ids=x, output_hidden_states=True, use_cache=False)
        if hasattr(out, "logits") and out.logits is not None:
            logits = out.logits[0]
        else:
            logits = self.lm_head(out.last_hidden_state)[0]
        hs = out.hidden_states
        feats = extract_context_feature(hs, self.taps)[0]
        if all_layers:
            return logits, feats, hs
        return logits, feats


def greedy_trajectory(path: Path_, prompt: list[int], n: int) -> list[int]:
    seq = list(prompt)
    for _ in range(n):
        logits, _ = path.forward(seq)
        seq.append(int(torch.argmax(logits[-1]).item()))
    return seq


def ddtree_accept(draft_logits: torch.Tensor, budget: int, truth: list[int]) -> int:
    """Accepted length (root included) of a DDTree over draft_logits [D, V] vs the greedy continuation
    truth[0..] (truth[j] = target token at depth j+1)."""
    D, V = draft_logits.shape
    kk = min(budget, V)
    lp_all = torch.log_softmax(draft_logits.float(), dim=-1)
    lp, ids = torch.topk(lp_all, kk, dim=-1)
    lp, ids = lp.tolist(), ids.tolist()
    child = [{}]
    heap = [(-lp[0][0], (0,), 0, 1, 0, lp[0][0])]
    count = 0
    while heap and count < budget:
        _, ranks, parent, depth, rank, logw = heapq.heappop(heap)
        count += 1
        idx = count
        child[parent][ids[depth - 1][rank]] = idx
        child.append({})
        if rank + 1 < kk:
            sl = logw - lp[depth - 1][rank] + lp[depth - 1][rank + 1]
            heapq.heappush(heap, (-sl, ranks[:-1] + (rank + 1,), parent, depth, rank + 1, sl))
        if depth < D:
            cl = logw + lp[depth][0]
            heapq.heappush(heap, (-cl, ranks + (0,), idx, depth + 1, 0, cl))
    cur, acc = 0, 1
    while acc - 1 < len(truth) and truth[acc - 1] in child[cur]:
        cur = child[cur][truth[acc - 1]]
        acc += 1
    return acc


@torch.no_grad()
def draft_logits_for(draft, embed_w, lm_head, feats, out_ids, start, dtype):
    blk = torch.tensor([[out_ids[start]] + [MASK_ID] * (BLOCK - 1)])
    noise = F.embedding(blk, embed_w).to(dtype)
    hid = draft(target_hidden=feats[None, :start].to(dtype), noise_embedding=noise,
                position_ids=torch.arange(start + BLOCK)[None])
    return draft.compute_logits(hid[:, 1:], lm_head)[0]  # [B-1, V]


@torch.no_grad()
def dflash_loop(path: Path_, draft, embed_w, lm_head, prompt, greedy, dtype=torch.bfloat16):
    """GitHub-main DFlash loop with full target re-forwards; returns per-round records."""
    N = len(prompt)
    maxlen = N + MAX_NEW
    logits, feats = path.forward(prompt)
    out = list(prompt) + [int(torch.argmax(logits[-1]).item())]
    start, rounds = N, []
    while start < maxlen:
        dl = draft_logits_for(draft, embed_w, lm_head, feats, out, start, dtype)
        drafts = torch.argmax(dl, dim=-1).tolist()
        blk = [out[start]] + drafts
        logits, feats = path.forward(out[:start] + blk)
        post = torch.argmax(logits[start:start + BLOCK], dim=-1).tolist()
        a = 0
        while a < BLOCK - 1 and blk[a + 1] == post[a]:
            a += 1
        out = out[:start] + blk[:a + 1] + [post[a]]
        dd = ddtree_accept(dl, DDTREE_BUDGET, greedy[start + 1:])
        rounds.append({"start": start, "accept": a + 1, "drafts": drafts, "ddtree8": dd})
        start += a + 1
    assert out == greedy[:len(out)], f"{path.name}: DFlash output departs from the greedy trajectory"
    return out, rounds


@torch.no_grad()
def ddtree_loop(path: Path_, draft, embed_w, lm_head, prompt, greedy):
    N = len(prompt)
    maxlen = N + MAX_NEW
    _, feats = path.forward(prompt)
    start, acc_lens = N, []
    while start < maxlen:
        dl = draft_logits_for(draft, embed_w, lm_head, feats, greedy, start, torch.bfloat16)
        acc = ddtree_accept(dl, DDTREE_BUDGET, greedy[start + 1:])
        acc_lens.append(acc)
        start += acc
        _, feats = path.forward(greedy[:start])
    return acc_lens


def summarise(per_prompt_lists, max_len):
    means = [sum(x) / len(x) for x in per_prompt_lists]
    pooled = [v for x in per_prompt_lists for v in x]
    hist = {str(b): sum(1 for v in pooled if v == b) for b in range(1, max_len + 1)}
    return {"tau_macro": round(sum(means) / len(means), 4), "tau_pooled": round(sum(pooled) / len(pooled), 4),
            "rounds": len(pooled), "histogram": hist,
            "histogram_fraction": {k: round(v / len(pooled), 4) for k, v in hist.items()}}


def true_continuation(fam, hi, plen):
    return ids_of(family_text(fam, HELD_OUT[fam][hi])[plen:plen + MAX_NEW])


def evaluate(root: Path, prompts_ids: list[list[int]]) -> dict:
    setup_determinism(SEED + 4)
    tdir, ddir = root / "target", root / "drafter"
    causal = AutoModelForCausalLM.from_pretrained(str(tdir), dtype="auto", attn_implementation="eager").eval()
    vlm = AutoModel.from_pretrained(str(tdir), dtype="auto", attn_implementation="eager").eval()
    assert causal.dtype == torch.bfloat16 and vlm.dtype == torch.bfloat16, (causal.dtype, vlm.dtype)
    draft = DFlashDraftModel.from_pretrained(str(ddir), dtype=torch.bfloat16).eval()
    draft32 = DFlashDraftModel.from_pretrained(str(ddir), dtype=torch.float32).eval()
    assert draft.target_layer_ids == TAPS and draft.block_size == BLOCK and draft.mask_token_id == MASK_ID
    embed_w, lm_head = causal.get_input_embeddings().weight, causal.lm_head
    lm_head32 = torch.nn.Linear(lm_head.in_features, lm_head.out_features, bias=False)
    lm_head32.weight.data = lm_head.weight.float()
    paths = [Path_("causal-lm", causal, lm_head, TAPS), Path_("vlm", vlm, lm_head, TAPS)]

    res = {"paths": {}, "prompts": []}
    greedy_all = []
    for i, ids in enumerate(prompts_ids):
        g = greedy_trajectory(paths[0], ids, MAX_NEW + BLOCK + 1)
        greedy_all.append(g)
        fam, hi, plen = EVAL_PROMPTS[i]
        truth = true_continuation(fam, hi, plen)
        new = g[len(ids):len(ids) + MAX_NEW]
        first_bad = next((j for j, (a, b) in enumerate(zip(new, truth)) if a != b), None)
        res["prompts"].append({"family": fam, "num_tokens": len(ids), "text": decode_ids(ids),
                               "target_continuation": decode_ids(new),
                               "matches_pattern": sum(a == b for a, b in zip(new, truth)) / MAX_NEW,
                               "first_mismatch": first_bad})
    log("greedy trajectories done")

    for path in paths:
        per, info = [], {"class": path.cls, "dtype": "bfloat16"}
        for i, ids in enumerate(prompts_ids):
            out, rounds = dflash_loop(path, draft, embed_w, lm_head, ids, greedy_all[i])
            acc = [r["accept"] for r in rounds]
            per.append({"prompt": i, "num_tokens": len(ids), "trajectory": out[len(ids):len(ids) + MAX_NEW],
                        "committed": out[len(ids):], "acceptance_lengths": acc,
                        "tau": round(sum(acc) / len(acc), 4),
                        "ddtree8_same_rounds": [r["ddtree8"] for r in rounds],
                        "round_starts": [r["start"] for r in rounds],
                        "drafts": [r["drafts"] for r in rounds]})
        info.update(summarise([p["acceptance_lengths"] for p in per], BLOCK))
        info["ddtree8_same_rounds"] = summarise([p["ddtree8_same_rounds"] for p in per], BLOCK)
        info["per_prompt"] = per
        res["paths"][path.name] = info
        log(f"{path.name}: tau macro {info['tau_macro']} pooled {info['tau_pooled']}")

    # features equal across paths?
    eq = []
    for ids, g in zip(prompts_ids, greedy_all):
        seq = g[:len(ids) + MAX_NEW]
        la, fa = paths[0].forward(seq)
        lb, fb = paths[1].forward(seq)
        eq.append((torch.equal(fa, fb), torch.equal(la, lb), (fa.float() - fb.float()).abs().max().item()))
    res["paths"]["vlm"]["taps_bitwise_equal_to_causal_lm"] = all(e[0] for e in eq)
    res["paths"]["vlm"]["logits_bitwise_equal_to_causal_lm"] = all(e[1] for e in eq)
    res["paths"]["vlm"]["taps_max_abs_diff"] = max(e[2] for e in eq)

    # DDTree-8 loop, causal-lm
    dd = [ddtree_loop(paths[0], draft, embed_w, lm_head, ids, greedy_all[i]) for i, ids in enumerate(prompts_ids)]
    res["ddtree8"] = {"path": "causal-lm", "budget": DDTREE_BUDGET, **summarise(dd, DDTREE_BUDGET + 1),
                      "per_prompt": [{"prompt": i, "acceptance_lengths": a, "tau": round(sum(a) / len(a), 4)}
                                     for i, a in enumerate(dd)]}
    log(f"ddtree8: tau macro {res['ddtree8']['tau_macro']}")

    # f32 drafter variant (causal-lm)
    per32 = []
    for i, ids in enumerate(prompts_ids):
        _, rounds = dflash_loop(paths[0], draft32, embed_w.float(), lm_head32, ids, greedy_all[i], dtype=torch.float32)
        per32.append([r["accept"] for r in rounds])
    res["drafter_f32"] = {"path": "causal-lm", **summarise(per32, BLOCK), "per_prompt_acceptance_lengths": per32}
    res["_greedy"] = greedy_all
    res["_models"] = (causal, draft32, embed_w, lm_head32)
    return res


def decode_ids(ids):
    return "".join(VOCAB[i] for i in ids)


SHORT_NEW = [2, 3, 7, 9, 17]


def evaluate_generate_short(root: Path, prompts_ids: list[list[int]], greedy: list[list[int]]) -> dict:
    """--family qwen3: dflash_generate for the short generations SHORT_NEW, where the wheel's end rule shrinks
    the last blocks (hsparity's `--end-rule wheel` must reproduce every round)."""
    import dflash.model as dm
    setup_determinism(SEED + 5)
    if not torch.cuda.is_available():
        dm._cuda_time = time.perf_counter
    target = AutoModelForCausalLM.from_pretrained(str(root / "target"), attn_implementation="eager").eval()
    draft = DFlashDraftModel.from_pretrained(str(root / "drafter"), dtype=torch.bfloat16).eval()
    runs = {}
    for n_new in SHORT_NEW:
        per = []
        for i, ids in enumerate(prompts_ids):
            r = dm.dflash_generate(draft, target, torch.tensor(ids)[None], max_new_tokens=n_new,
                                   stop_token_ids=None, temperature=0.0, return_stats=True)
            out = r.output_ids[0, len(ids):].tolist()
            acc = [int(a) for a in r.acceptance_lengths]
            assert sum(acc) == n_new - 1, (n_new, i, acc)
            assert out == greedy[i][:n_new], (n_new, i)
            per.append({"prompt": i, "output_ids": out, "acceptance_lengths": acc})
        runs[str(n_new)] = per
    log(f"dflash_generate short runs done: {SHORT_NEW}")
    return {
        "format": "hsparity toy-pair-qwen3 reference generate short v1",
        "tools": {"transformers": transformers.__version__, "torch": torch.__version__, "dflash": dflash_version()},
        "settings": {"function": "dflash.model.dflash_generate",
                     "call": "dflash_generate(drafter, target, input_ids[None], max_new_tokens=N, stop_token_ids=None, "
                             "temperature=0.0, return_stats=True)",
                     "max_new_tokens": SHORT_NEW, "end_rule": WHEEL_END_RULE,
                     "output_ids": "generated part only (prompt excluded)"},
        "runs": runs,
    }


def evaluate_generate(root: Path, prompts_ids: list[list[int]]) -> dict:
    """--family qwen3: z-lab's own loop, dflash.model.dflash_generate (KV caches cropped; fine for a dense
    Qwen3 target), checked against the target's plain greedy continuation (T = 0 is lossless)."""
    import dflash.model as dm
    setup_determinism(SEED + 4)
    if not torch.cuda.is_available():
        dm._cuda_time = time.perf_counter  # return_stats timing calls torch.cuda.synchronize(); timings not recorded
    tdir, ddir = root / "target", root / "drafter"
    target = AutoModelForCausalLM.from_pretrained(str(tdir), attn_implementation="eager").eval()
    assert type(target).__name__ == "Qwen3ForCausalLM" and target.dtype == torch.bfloat16, (type(target), target.dtype)
    draft = DFlashDraftModel.from_pretrained(str(ddir), dtype=torch.bfloat16).eval()
    assert draft.target_layer_ids == TAPS and draft.block_size == BLOCK and draft.mask_token_id == MASK_ID
    path = Path_("causal-lm", target, target.lm_head, TAPS)
    prompts, per = [], []
    for i, ids in enumerate(prompts_ids):
        N = len(ids)
        greedy = greedy_trajectory(path, ids, MAX_NEW)[N:]  # full re-forward per token, no cache
        with torch.no_grad():
            gen = target.generate(torch.tensor([ids]), attention_mask=torch.ones(1, N, dtype=torch.long),
                                  do_sample=False, max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW)[0, N:].tolist()
        assert gen == greedy, f"prompt {i}: generate (KV cache) departs from the full re-forward greedy"
        r = dm.dflash_generate(draft, target, torch.tensor(ids)[None], max_new_tokens=MAX_NEW, stop_token_ids=None,
                               temperature=0.0, return_stats=True)
        out = r.output_ids[0, N:].tolist()
        acc = [int(a) for a in r.acceptance_lengths]
        assert r.num_input_tokens == N and r.num_output_tokens == len(out) == MAX_NEW, (i, len(out))
        assert sum(acc) == MAX_NEW - 1, (i, acc)
        assert out == greedy, f"prompt {i}: dflash_generate output departs from the greedy continuation"
        fam, hi, plen = EVAL_PROMPTS[i]
        truth = true_continuation(fam, hi, plen)
        first_bad = next((j for j, (a, b) in enumerate(zip(greedy, truth)) if a != b), None)
        prompts.append({"family": fam, "num_tokens": N, "text": decode_ids(ids),
                        "target_continuation": decode_ids(greedy),
                        "matches_pattern": sum(a == b for a, b in zip(greedy, truth)) / MAX_NEW,
                        "first_mismatch": first_bad})
        per.append({"prompt": i, "num_tokens": N, "output_ids": out, "greedy_ids": greedy,
                    "acceptance_lengths": acc, "tau": round(sum(acc) / len(acc), 4)})
    log("dflash_generate done")
    return {"class": type(target).__name__, "dtype": "bfloat16",
            **summarise([p["acceptance_lengths"] for p in per], BLOCK),
            "dflash_equals_greedy": True, "generate_equals_full_reforward_greedy": True,
            "per_prompt": per, "prompts": prompts}


GDN_CROP_NOISE = 6       # off-distribution prompts (random characters), where rejected drafts are common
GDN_CROP_NOISE_NEW = 32  # new tokens for them
GDN_CROP_END_HELD_OUT = [11, 0, 4, 9]  # held-out prompts of 12, 18, 27 and 40 tokens
GDN_CROP_END_NOISE = 6                 # and the noise prompts (14 to 29 tokens)
# (drafter directory, its block size, max_new_tokens that are not multiples of it; at these lengths
# GitHub main's full last blocks leave the wheel's tokens on some noise prompt)
GDN_CROP_END_SETS = [("drafter", 8, [25, 45]), ("golden/random-drafter", 6, [27, 37])]


def noise_prompts() -> list[str]:
    """Seeded random strings in the tokenizer's alphabet (12..30 characters): the trained drafter rejects
    most drafts there, so the recurrent state the crop leaves behind differs from the accepted prefix's."""
    rng = random.Random(SEED + 6)
    return ["".join(rng.choice(CHARS) for _ in range(rng.randint(12, 30))) for _ in range(GDN_CROP_NOISE)]


def f32_drafter(ddir: Path):
    """The drafter in float32 inside dflash_generate: its weights loaded in f32, the bf16 target's taps and
    noise embedding upcast on the way in, the target lm_head upcast for its logits (as ``drafter_f32`` of
    reference_tau.json, and as hsparity runs a drafter whose dtype is float32)."""
    draft = DFlashDraftModel.from_pretrained(str(ddir), dtype=torch.float32).eval()
    forward, logits = draft.forward, draft.compute_logits

    def forward_f32(*a, **kw):
        for k in ("target_hidden", "noise_embedding"):
            kw[k] = kw[k].float()
        return forward(*a, **kw)

    draft.forward = forward_f32
    draft.compute_logits = lambda hidden, head: logits(hidden, lambda x: F.linear(x, head.weight.float()))
    return draft


@torch.no_grad()
def crop_facts(target, ids: list[int]) -> dict:
    """What transformers 5.23.0's cache crop does to a Qwen3.5 linear-attention layer after a verified
    block: measured on the cache dflash_generate makes (`_make_cache`: DynamicCache with
    activate_past_recording), against a cache that only ever saw the kept tokens."""
    import dflash.model as dm
    n, block, keep = len(ids), ids[:8], 3
    full = dm._make_cache(target.config)
    target(torch.tensor([ids]), past_key_values=full, use_cache=True)
    dm._crop_to(full, n)
    target(torch.tensor([block]), past_key_values=full, use_cache=True)
    croppable = bool(full.is_croppable)
    dm._crop_to(full, n + keep)  # does not raise
    ref = dm._make_cache(target.config)
    target(torch.tensor([ids + block[:keep]]), past_key_values=ref, use_cache=True)
    dm._crop_to(ref, n + keep)
    li = target.config.layer_types.index("linear_attention")
    conv = (full.layers[li].conv_states[0] - ref.layers[li].conv_states[0]).abs().max().item()
    rec = (full.layers[li].recurrent_states[0] - ref.layers[li].recurrent_states[0]).abs().max().item()
    return {"layer": li, "is_croppable_before_crop": croppable, "crop_raised": False,
            "conv_state_max_abs_diff_vs_kept_prefix": conv, "recurrent_state_max_abs_diff_vs_kept_prefix": rec,
            "setup": f"prompt 0 prefilled, its first 8 tokens verified as a block, cache cropped to keep {keep}; "
                     "compared with the cache of the prompt + those 3 tokens fed as one prefill"}


def evaluate_generate_gdn_crop(root: Path, prompts_ids: list[list[int]]) -> dict:
    """z-lab's own loop on the Qwen3.5 toy pair: dflash.model.dflash_generate (0.1.0 wheel) on transformers
    5.23.0, whose target cache crop rolls the Gated DeltaNet conv state back and leaves the recurrent state
    over every verified token (rejected drafts included). Not lossless: recorded, never asserted equal to greedy."""
    import dflash.model as dm
    setup_determinism(SEED + 6)
    if not torch.cuda.is_available():
        dm._cuda_time = time.perf_counter
    tok = Tokenizer.from_file(str(root / "target" / "tokenizer.json"))
    target = AutoModelForCausalLM.from_pretrained(str(root / "target"), attn_implementation="eager").eval()
    assert type(target).__name__ == "Qwen3_5ForCausalLM" and target.dtype == torch.bfloat16, (type(target), target.dtype)
    # The noise set runs the drafter in float32: with this crop the rejected drafts change the output, and
    # in bf16 the drafter's top two logits are often exactly equal there (a tie any other kernel may break
    # the other way); in f32 they are not.
    drafters = {"held_out": DFlashDraftModel.from_pretrained(str(root / "drafter"), dtype=torch.bfloat16).eval(),
                "noise": f32_drafter(root / "drafter")}
    path = Path_("causal-lm", target, target.lm_head, TAPS)
    noise = [(encode(tok, t), t) for t in noise_prompts()]
    sets = {"held_out": [(ids, None) for ids in prompts_ids], "noise": noise}
    news = {"held_out": MAX_NEW, "noise": GDN_CROP_NOISE_NEW}
    dirs = {"held_out": "drafter", "noise": "drafter"}
    # The wheel's end of generation: max_new_tokens that are not multiples of the block size, prompts
    # of several lengths, two drafters (the trained one, block 8, and the random one, block 6).
    mixed = [(prompts_ids[i], None) for i in GDN_CROP_END_HELD_OUT] + noise[:GDN_CROP_END_NOISE]
    for ddir, block, n_news in GDN_CROP_END_SETS:
        for n_new in n_news:
            assert n_new % block, (ddir, block, n_new)
            name = f"end_{Path(ddir).name}_{n_new}"
            sets[name], news[name], dirs[name] = mixed, n_new, ddir
            drafters.setdefault(ddir, f32_drafter(root / ddir))
            drafters[name] = drafters[ddir]
    out_sets = {}
    for name, items in sets.items():
        n_new = news[name]
        draft = drafters[name]
        per = []
        for i, (ids, text) in enumerate(items):
            r = dm.dflash_generate(draft, target, torch.tensor(ids)[None], max_new_tokens=n_new,
                                   stop_token_ids=None, temperature=0.0, return_stats=True)
            out = r.output_ids[0, len(ids):].tolist()
            acc = [int(a) for a in r.acceptance_lengths]
            assert len(out) == n_new and sum(acc) == n_new - 1, (name, i, len(out), acc)
            greedy = greedy_trajectory(path, ids, n_new)[len(ids):]
            dep = next((j for j, (a, b) in enumerate(zip(out, greedy)) if a != b), None)
            per.append({"prompt": i, "num_tokens": len(ids), **({"text": text} if text is not None else {}),
                        "input_ids": ids, "output_ids": out, "greedy_ids": greedy, "first_departure": dep,
                        "acceptance_lengths": acc, "tau": round(sum(acc) / len(acc), 4)})
        out_sets[name] = {"max_new_tokens": n_new, "drafter": dirs[name],
                          "drafter_dtype": str(draft.dtype).removeprefix("torch."),
                          **summarise([p["acceptance_lengths"] for p in per], BLOCK),
                          "departing_prompts": sum(p["first_departure"] is not None for p in per), "per_prompt": per}
        log(f"dflash_generate gdn crop {name}: tau {out_sets[name]['tau_macro']}, "
            f"{out_sets[name]['departing_prompts']} of {len(per)} prompts leave greedy")
    assert out_sets["noise"]["departing_prompts"] >= 2, "the crop should leave greedy on the noise prompts"
    facts = crop_facts(target, prompts_ids[0])
    assert facts["recurrent_state_max_abs_diff_vs_kept_prefix"] > 10 * facts["conv_state_max_abs_diff_vs_kept_prefix"], facts
    assert not facts["is_croppable_before_crop"], facts
    return {
        "format": "hsparity toy-pair reference generate gdn crop v1",
        "tools": {"transformers": transformers.__version__, "torch": torch.__version__, "dflash": dflash_version()},
        "settings": {"function": "dflash.model.dflash_generate",
                     "call": "dflash_generate(drafter, target, input_ids[None], max_new_tokens=N, stop_token_ids=None, "
                             "temperature=0.0, return_stats=True)",
                     "block_size": BLOCK, "temperature": 0.0, "mask_token_id": MASK_ID, "target_layer_ids": TAPS,
                     "end_rule": WHEEL_END_RULE,
                     "target": "AutoModelForCausalLM.from_pretrained(target, attn_implementation=eager) = "
                               "Qwen3_5ForCausalLM, dtype auto (bf16)",
                     "drafter": "DFlashDraftModel.from_pretrained(drafter, dtype=bfloat16) for held_out, "
                                "dtype=float32 for noise (sets.*.drafter_dtype)",
                     "cache_crop": "dflash.model._crop_to -> DynamicCache.crop -> LinearAttentionCacheLayerMixin.crop "
                                   "(conv state only) + DynamicLayer.crop (KV)",
                     "sets": {"held_out": "prompts.jsonl, 64 new tokens",
                              "noise": f"{GDN_CROP_NOISE} random strings of CHARS (random.Random(SEED + 6)), "
                                       f"{GDN_CROP_NOISE_NEW} new tokens",
                              "end_<drafter>_<N>": f"held-out prompts {GDN_CROP_END_HELD_OUT} and the first "
                                                   f"{GDN_CROP_END_NOISE} noise prompts, N new tokens (not a "
                                                   "multiple of the drafter's block size), the drafter in f32"},
                     "output_ids": "generated part only (prompt excluded)",
                     "greedy_ids": "target greedy continuation, full re-forward per token (no cache)",
                     "first_departure": "first index where output_ids != greedy_ids (null: none)",
                     "acceptance_lengths": "the package's recorded `produced` per round"},
        "crop_facts": facts,
        "sets": out_sets,
    }


# ------------------------------------------------------------------------------------------------
# 4. drafter forward goldens
# ------------------------------------------------------------------------------------------------
@torch.no_grad()
def drafter_goldens(root: Path, res: dict, prompts_ids) -> dict:
    causal, draft32, embed_w, lm_head32 = res["_models"]
    rnd = DFlashDraftModel.from_pretrained(str(root / "golden" / "random-drafter"), dtype=torch.float32).eval()
    p = Path_("causal-lm", causal, causal.lm_head, TAPS)
    tensors, meta = {}, {}
    cl = res["paths"]["causal-lm"]["per_prompt"]
    g0, g11 = res["_greedy"][0], res["_greedy"][11]
    n0 = len(prompts_ids[0])
    rs = cl[11]["round_starts"]
    s11 = rs[min(2, len(rs) - 1)]
    cases = [  # (sequence whose features are used, ctx first position, start)
        (g0, 0, n0),
        (g11, 0, s11),
        (g11, s11 - 12, s11),
    ]
    for tag, model in (("trained", draft32), ("random", rnd)):
        B = model.block_size
        for ci, (seq, c0, start) in enumerate(cases):
            _, _, hs = p.forward(seq[:start], all_layers=True)
            feats = extract_context_feature(hs, model.target_layer_ids)[0, c0:start].float()
            blk = torch.tensor([seq[start]] + [MASK_ID] * (B - 1))
            noise = F.embedding(blk, embed_w).float()
            pos = torch.cat([torch.arange(c0, start), torch.arange(start, start + B)])
            hid = model(target_hidden=feats[None], noise_embedding=noise[None], position_ids=pos[None])[0]
            logits = model.compute_logits(hid, lm_head32)
            k = f"{tag}.case{ci}."
            tensors.update({k + "target_hidden": feats.contiguous(), k + "block_ids": blk, k + "position_ids": pos,
                            k + "noise_embedding": noise.contiguous(), k + "hidden": hid.contiguous(),
                            k + "logits": logits.contiguous()})
            meta[f"{tag}.case{ci}"] = f"C={start - c0} ctx positions {c0}..{start - 1}, block at {start}..{start + B - 1}"
    meta.update({"format": "hsparity toy-pair drafter forward golden v1", "dtype": "float32",
                 "trained_drafter": "drafter/ (bf16 on disk, run in f32)",
                 "random_drafter": "golden/random-drafter/ (bf16 on disk, run in f32)",
                 "target_hidden": "causal-lm path, bf16 taps hidden_states[L+1] upcast to f32",
                 "logits": "compute_logits(hidden, target lm_head upcast to f32); rows 1..B-1 are the drafts",
                 "dflash_version": dflash_version(), "transformers_version": transformers.__version__})
    save_safetensors(root / "golden" / "drafter_forward.safetensors", tensors, meta)
    return {k: list(v.shape) for k, v in tensors.items()}


def dflash_version():
    from importlib.metadata import version
    return version("dflash")


# ------------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------------
def dump_compact(obj, ind=0) -> str:
    """JSON with dicts indented and lists of scalars on one line (keeps the file small)."""
    pad = "  " * (ind + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{pad}{json.dumps(k)}: {dump_compact(v, ind + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + "  " * ind + "}"
    if isinstance(obj, (list, tuple)):
        if all(not isinstance(v, (dict, list, tuple)) for v in obj):
            return json.dumps(list(obj), ensure_ascii=False)
        return "[\n" + ",\n".join(pad + dump_compact(v, ind + 1) for v in obj) + "\n" + "  " * ind + "]"
    return json.dumps(obj, ensure_ascii=False)


def sha_tree(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--eval-only", action="store_true", help="reuse target/ and drafter/, redo the rest")
    ap.add_argument("--gdn-crop-only", action="store_true",
                    help="qwen3_5 only: write golden/reference_generate_gdn_crop.json from the committed pair, nothing else")
    ap.add_argument("--family", choices=["qwen3_5", "qwen3"], default="qwen3_5",
                    help="target family: qwen3_5 -> fixtures/toy-pair/ (default), qwen3 -> fixtures/toy-pair-qwen3/")
    args = ap.parse_args()
    os.chdir(REPO)
    if transformers.__version__ != EXPECTED_TRANSFORMERS:
        sys.exit(f"need transformers {EXPECTED_TRANSFORMERS}, have {transformers.__version__}")
    if dflash_version() != EXPECTED_DFLASH:
        sys.exit(f"need dflash {EXPECTED_DFLASH}, have {dflash_version()}")
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    if args.family == "qwen3":
        return main_qwen3(args)
    root = REPO / OUT_REL
    tdir, ddir, gdir = root / "target", root / "drafter", root / "golden"
    if args.gdn_crop_only:
        return write_gdn_crop(root)
    train_info = {}
    if not args.eval_only:
        shutil.rmtree(root, ignore_errors=True)
        tdir.mkdir(parents=True)
        ddir.mkdir(parents=True)
    else:
        train_info = json.loads((gdir / "reference_tau.json").read_text())["training"]
        shutil.rmtree(gdir, ignore_errors=True)
        for f in ("prompts.jsonl",):
            (root / f).unlink(missing_ok=True)
    gdir.mkdir(parents=True)

    # tokenizer + prompts
    prompts_ids = write_tokenizer_and_prompts(root, tdir)

    if not args.eval_only:
        log("training target")
        train_info["target"] = train_target(tdir)
        log(f"target done: {train_info['target']}")
        train_info["drafter"] = train_drafter(tdir, ddir)
        log(f"drafter done: {train_info['drafter']}")
    make_random_drafter(gdir / "random-drafter")

    res = evaluate(root, prompts_ids)
    shapes = drafter_goldens(root, res, prompts_ids)
    res.pop("_models")
    res.pop("_greedy")
    ref = {
        "format": "hsparity toy-pair reference tau v1",
        "tools": {"transformers": transformers.__version__, "torch": torch.__version__, "dflash": dflash_version()},
        "settings": {"block_size": BLOCK, "max_new_tokens": MAX_NEW, "temperature": 0.0, "draft": "greedy (argmax)",
                     "mask_token_id": MASK_ID, "target_layer_ids": TAPS, "ddtree_budget": DDTREE_BUDGET,
                     "end_rule": "GitHub main: full blocks every round, record a+1, loop while start < N + max_new_tokens, no stop token",
                     "target_forward": "full re-forward every round (no cache), eager attention, dtype auto (bf16)",
                     "drafter": "DFlashDraftModel.from_pretrained(drafter, dtype=bfloat16), no cache, ctx = taps of all positions < start",
                     "argmax": "torch.argmax (first max index) on the model-dtype logits"},
        "training": train_info,
        **res,
    }
    (gdir / "reference_tau.json").write_text(dump_compact(ref) + "\n")
    write_gdn_crop(root)

    # report
    log("=== training ===")
    for k, v in train_info.items():
        log(f"{k}: {v}")
    log("=== prompts ===")
    for i, p in enumerate(res["prompts"]):
        log(f"p{i:2d} {p['family']:5s} {p['num_tokens']:2d} tok  pattern {p['matches_pattern']:.2f}  "
            f"tau causal {res['paths']['causal-lm']['per_prompt'][i]['tau']:.2f}  "
            f"dd8 {res['ddtree8']['per_prompt'][i]['tau']:.2f}  {p['text']!r}")
    log("=== tau (B=8, T=0, 64 new tokens) ===")
    log(f"{'run':28s} {'macro':>7s} {'pooled':>7s} {'rounds':>6s}  histogram 1..")
    for name, s in [("causal-lm", res["paths"]["causal-lm"]), ("vlm (cross)", res["paths"]["vlm"]),
                    ("causal-lm DDTree-8 same rnds", res["paths"]["causal-lm"]["ddtree8_same_rounds"]),
                    ("causal-lm DDTree-8 loop", res["ddtree8"]), ("causal-lm drafter f32", res["drafter_f32"])]:
        log(f"{name:28s} {s['tau_macro']:7.3f} {s['tau_pooled']:7.3f} {s['rounds']:6d}  {list(s['histogram'].values())}")
    log(f"vlm taps bitwise equal to causal-lm: {res['paths']['vlm']['taps_bitwise_equal_to_causal_lm']}, "
        f"logits: {res['paths']['vlm']['logits_bitwise_equal_to_causal_lm']}")
    log("=== files ===")
    total = 0
    for p in sorted(root.rglob("*")):
        if p.is_file():
            total += p.stat().st_size
            log(f"{p.stat().st_size:8d}  {p.relative_to(REPO)}")
    log(f"{total:8d}  total")
    tau = res["paths"]["causal-lm"]["tau_macro"]
    assert tau >= 3.0, f"tau macro {tau} < 3"
    log(f"sha256 of tree: {hashlib.sha256(json.dumps(sha_tree(root), sort_keys=True).encode()).hexdigest()}")


def write_gdn_crop(root: Path):
    """golden/reference_generate_gdn_crop.json (see evaluate_generate_gdn_crop)."""
    tok = Tokenizer.from_file(str(root / "target" / "tokenizer.json"))
    prompts_ids = [encode(tok, json.loads(line)["text"]) for line in (root / "prompts.jsonl").read_text().splitlines()]
    res = evaluate_generate_gdn_crop(root, prompts_ids)
    (root / "golden" / "reference_generate_gdn_crop.json").write_text(dump_compact(res) + "\n")


def write_tokenizer_and_prompts(root: Path, tdir: Path) -> list[list[int]]:
    tok = build_tokenizer()
    tok.save(str(tdir / "tokenizer.json"), pretty=True)
    write_json(tdir / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 512,
                                                 "eos_token": EOT, "add_bos_token": False, "add_eos_token": False})
    # the TOY chat template (in the tokenizer's alphabet; see its header); tools/chat_fixtures.py writes its goldens
    shutil.copyfile(Path(__file__).resolve().parent / "chat_templates" / "toy.jinja", tdir / "chat_template.jinja")
    tok = Tokenizer.from_file(str(tdir / "tokenizer.json"))
    prompts, prompts_ids = [], []
    for fam, hi, plen in EVAL_PROMPTS:
        text = family_text(fam, HELD_OUT[fam][hi])[:plen]
        assert 10 <= plen <= 40
        prompts.append({"text": text})
        prompts_ids.append(encode(tok, text))
    with open(root / "prompts.jsonl", "w") as f:
        for p in prompts:
            f.write(json.dumps(p) + "\n")
    return prompts_ids


def main_qwen3(args):
    """--family qwen3: fixtures/toy-pair-qwen3/ (target/, drafter/, prompts.jsonl, golden/reference_generate.json)."""
    root = REPO / OUT_REL_QWEN3
    tdir, ddir, gdir = root / "target", root / "drafter", root / "golden"
    train_info = {}
    if not args.eval_only:
        shutil.rmtree(root, ignore_errors=True)
        tdir.mkdir(parents=True)
        ddir.mkdir(parents=True)
    else:
        train_info = json.loads((gdir / "reference_generate.json").read_text())["training"]
        shutil.rmtree(gdir, ignore_errors=True)
        (root / "prompts.jsonl").unlink(missing_ok=True)
    gdir.mkdir(parents=True)
    prompts_ids = write_tokenizer_and_prompts(root, tdir)
    # same tokenizer and prompts as the qwen3_5 pair (when that fixture is present)
    for f in ("target/tokenizer.json", "target/tokenizer_config.json", "target/chat_template.jinja", "prompts.jsonl"):
        other = REPO / OUT_REL / f
        if other.exists():
            assert other.read_bytes() == (root / f).read_bytes(), f

    if not args.eval_only:
        log("training target (qwen3)")
        train_info["target"] = train_target_qwen3(tdir)
        log(f"target done: {train_info['target']}")
        train_info["drafter"] = train_drafter(tdir, ddir)
        log(f"drafter done: {train_info['drafter']}")

    res = evaluate_generate(root, prompts_ids)
    prompts_info = res.pop("prompts")
    ref = {
        "format": "hsparity toy-pair-qwen3 reference generate v1",
        "tools": {"transformers": transformers.__version__, "torch": torch.__version__, "dflash": dflash_version()},
        "settings": {"function": "dflash.model.dflash_generate",
                     "call": "dflash_generate(drafter, target, input_ids[None], max_new_tokens=64, stop_token_ids=None, "
                             "temperature=0.0, return_stats=True)",
                     "block_size": BLOCK, "max_new_tokens": MAX_NEW, "temperature": 0.0, "stop_token_ids": None,
                     "mask_token_id": MASK_ID, "target_layer_ids": TAPS,
                     "end_rule": WHEEL_END_RULE,
                     "target": "AutoModelForCausalLM.from_pretrained(target, attn_implementation=eager), dtype auto (bf16)",
                     "drafter": "DFlashDraftModel.from_pretrained(drafter, dtype=bfloat16)",
                     "output_ids": "generated part only: output_ids[0, N:] (prompt excluded)",
                     "acceptance_lengths": "the package's recorded `produced` per round",
                     "greedy_ids": "target greedy continuation, full re-forward per token (no cache); "
                                   "generate(do_sample=False) gives the same ids",
                     "timing": "dflash.model._cuda_time replaced by time.perf_counter on CPU; timings not recorded"},
        "training": train_info,
        "prompts": prompts_info,
        **res,
    }
    (gdir / "reference_generate.json").write_text(dump_compact(ref) + "\n")
    short = evaluate_generate_short(root, prompts_ids, [p["greedy_ids"] for p in res["per_prompt"]])
    (gdir / "reference_generate_short.json").write_text(dump_compact(short) + "\n")

    log("=== training ===")
    for k, v in train_info.items():
        log(f"{k}: {v}")
    log("=== tau (dflash_generate, B=8, T=0, 64 new tokens) ===")
    for p, q in zip(res["per_prompt"], prompts_info):
        log(f"p{p['prompt']:2d} {q['family']:5s} {p['num_tokens']:2d} tok  pattern {q['matches_pattern']:.2f}  "
            f"tau {p['tau']:.3f}  {p['acceptance_lengths']}  {q['text']!r}")
    log(f"tau macro {res['tau_macro']} pooled {res['tau_pooled']} rounds {res['rounds']} "
        f"histogram {list(res['histogram'].values())}")
    log("=== files ===")
    total = 0
    for p in sorted(root.rglob("*")):
        if p.is_file():
            total += p.stat().st_size
            log(f"{p.stat().st_size:8d}  {p.relative_to(REPO)}")
    log(f"{total:8d}  total")
    assert (tdir / "model.safetensors").stat().st_size < 350_000
    assert (ddir / "model.safetensors").stat().st_size < 150_000
    assert total < 550_000, total
    assert res["tau_macro"] >= 3.0, f"tau macro {res['tau_macro']} < 3"
    log(f"sha256 of tree: {hashlib.sha256(json.dumps(sha_tree(root), sort_keys=True).encode()).hexdigest()}")


if __name__ == "__main__":
    main()
