#!/usr/bin/env python3
"""Chat-template fixtures and goldens for hsparity (``src/chat/``, ``src/prompt_sets.rs``).

CI never runs this script: its outputs are committed and ``tests/chat_templates.rs`` /
``tests/prompt_sets.rs`` only read them. ``tools/make_fixtures.py`` imports it (the Qwen special
tokens and the tokenizer_config.json layout of the tiny tokenizer) and calls :func:`main` last;
it can also run alone, after the checkpoints exist:

    .venv/bin/python tools/chat_fixtures.py

Deterministic (no randomness besides Python's ``random`` seeded exactly as z-lab/dflash seeds it);
JSON written with sorted-free, fixed key order and ``ensure_ascii=False``.

What it writes
==============

``fixtures/toy-pair/target/chat_template.jinja``, ``fixtures/toy-pair-qwen3/target/chat_template.jinja``
    copies of ``tools/chat_templates/toy.jinja`` (a TOY template in the toy tokenizer's alphabet; see
    its header). The toy weights and tokenizer are not touched.

``fixtures/chat/<fixture>.json`` for tiny-qwen3_5, tiny-qwen3, toy-pair, toy-pair-qwen3
    transformers 5.23.0 ``tokenizer.apply_chat_template`` on a matrix of conversations (CONVERSATIONS
    for the Qwen families, TOY_CONVERSATIONS for the toy pairs) x ``enable_thinking`` true / false /
    unset (unset = the keyword is not passed at all), always ``add_generation_prompt=True``:

        {"fixture", "checkpoint", "tool_version", "jinja2_version", "tokenizer_class",
         "special_tokens_map", "template": {"file", "sha256"},
         "ids": how the ids were produced, "transformers_ids_match_tokenizer_json": bool, "note",
         "cases": [{"name", "enable_thinking": "true"|"false"|"unset", "line",
                    "text", "ids", "transformers_ids", "error"}]}

    ``line`` is the conversation as one OpenAI-style JSONL line (``{"messages": [...]}``, plus
    ``"tools"`` where the case has tools). ``text`` = ``apply_chat_template(..., tokenize=False)``;
    ``transformers_ids`` = ``apply_chat_template(..., tokenize=True)["input_ids"]`` (which encodes the
    text with ``add_special_tokens=False``); ``ids`` = the checkpoint's ``tokenizer.json`` (Python
    ``tokenizers``) encoding of ``text`` without special tokens, which is what hsparity reads. The
    two agree on the tiny fixtures (asserted). On the Qwen3.5 toy pair they do not: ``AutoTokenizer``
    builds ``Qwen3_5Tokenizer`` for ``model_type qwen3_5`` whatever tokenizer_config.json says and
    replaces the pre-tokenizer with the Qwen regex + byte-level mapping, so the toy tokenizer's
    ``' '`` (the byte-level alphabet has ``'Ġ'``) is dropped; the toy pair was trained and evaluated
    on ``tokenizer.json`` ids. ``error`` = ``{"type", "message"}`` when transformers raised (text and
    ids are null then).

``fixtures/chat/lookup.json``
    where transformers 5.23.0 takes the chat template from (``PreTrainedTokenizerBase.from_pretrained``
    / ``_from_pretrained`` and ``get_chat_template``), one case per directory layout: the files
    written (relative path -> content), then ``tokenizer.chat_template`` (a string, a dict of named
    templates or null) and ``get_chat_template()`` (the selected text, or the ValueError message),
    also with ``tools`` given.

``fixtures/chat/prompt-sets.json``
    the built-in benchmark prompt sets as z-lab/dflash ``dflash/benchmark.py`` (blob at
    ``1fe684b00efba56490d920d15eeb9ba6e4471751``) builds them: the ``DATASETS[name]["format"]``
    lambdas (L28-L55, copied verbatim below), the sample selection ``_limit_dataset`` (L96-L100:
    ``random.shuffle`` then the first ``max_samples``, only when the set is larger) after
    ``random.seed(0)`` (L207, transformers backend), and ``_apply_chat_template`` (L103-L109) with
    ``tokenizer.encode`` (L241) on ``fixtures/tiny-qwen3_5`` for the first samples.

``data/prompt-sets/zlab_shuffle.json``
    the permutation ``random.seed(S); x = list(range(N)); random.shuffle(x)`` for each set's N and
    S in (0, 42): the order ``_limit_dataset`` leaves a set in (seed 0: transformers backend, L207;
    seed 42: the module-level ``random.seed(42)`` at L23, which the mlx backend shuffles from).
    hsparity's ``prompt_sets::load`` reads it.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
TEMPLATES = REPO / "tools" / "chat_templates"
CHAT_OUT = REPO / "fixtures" / "chat"
DATA = REPO / "data" / "prompt-sets"

# ------------------------------------------------------------------------------------------------
# Qwen special tokens: the added tokens of Qwen/Qwen3-8B's tokenizer_config.json (ids 151643-151668
# there), in that order, with their "special" flags. The Qwen3.5 and Qwen3 templates emit only
# tokens from this list (<|im_start|>, <|im_end|>, <think>, </think>, <tool_call>, </tool_call>,
# <tool_response>, </tool_response>, <|vision_start|>, <|vision_end|>, <|image_pad|>, <|video_pad|>).
# ------------------------------------------------------------------------------------------------
QWEN_ADDED_TOKENS = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]
# Qwen/Qwen3-8B tokenizer_config.json "additional_special_tokens": the special added tokens but <|endoftext|>
QWEN_ADDITIONAL_SPECIAL = [t for t, special in QWEN_ADDED_TOKENS if special and t != "<|endoftext|>"]
QWEN_EOS = "<|im_end|>"
QWEN_PAD = "<|endoftext|>"

# The pre-tokenizer regexes of transformers 5.23.0's Qwen tokenizer classes
# (models/qwen3_5/tokenization_qwen3_5.py and models/qwen2/tokenization_qwen2.py, PRETOKENIZE_REGEX):
# AutoTokenizer rebuilds the pipeline from the class, so tokenizer.json must carry the same one for
# the Rust `tokenizers` crate to give transformers' ids.
QWEN3_5_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
                 r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
               r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")


def qwen_tokenizer_config(tokenizer_json: Path, model_max_length: int) -> dict:
    """tokenizer_config.json with the special-token fields laid out as Qwen/Qwen3-8B's (the
    ``added_tokens_decoder`` ids are this tokenizer's own). ``unk_token`` and ``bos_token`` are
    explicit nulls, so the class defaults of Qwen2Tokenizer / Qwen3_5Tokenizer (unk, eos, pad =
    ``<|endoftext|>``) do not apply; ``special_tokens_map`` is then {eos_token, pad_token}."""
    tj = json.loads(tokenizer_json.read_text())
    decoder = {}
    for t in tj["added_tokens"]:
        decoder[str(t["id"])] = {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word",
                                                   "special")}
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": list(QWEN_ADDITIONAL_SPECIAL),
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": QWEN_EOS,
        "errors": "replace",
        "model_max_length": model_max_length,
        "pad_token": QWEN_PAD,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def add_qwen_tokens(tok) -> None:
    """Append QWEN_ADDED_TOKENS to a ``tokenizers.Tokenizer`` in order (ids after the BPE vocab, as in
    the Qwen tokenizers), special ones as special tokens, the others as plain added tokens; none
    normalized, none stripping."""
    from tokenizers import AddedToken

    for content, special in QWEN_ADDED_TOKENS:
        t = AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)
        n = tok.add_special_tokens([t]) if special else tok.add_tokens([t])
        assert n == 1, content


def set_pre_tokenizer_regex(tokenizer_json: Path, regex: str) -> None:
    """Rewrite the Split pattern of a Qwen-style tokenizer.json (tiny-qwen3 carries Qwen2Tokenizer's)."""
    tj = json.loads(tokenizer_json.read_text())
    seq = tj["pre_tokenizer"]["pretokenizers"]
    assert seq[0]["type"] == "Split"
    seq[0]["pattern"] = {"Regex": regex}
    tokenizer_json.write_text(json.dumps(tj, indent=2, ensure_ascii=False) + "\n")


# ------------------------------------------------------------------------------------------------
# Conversations (one OpenAI-style JSONL line each)
# ------------------------------------------------------------------------------------------------
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather <now> & later for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                       "required": ["city"]},
    },
}

CONVERSATIONS = [
    ("single_user", {"messages": [{"role": "user", "content": "What is the capital of France?"}]}),
    ("system_user", {"messages": [
        {"role": "system", "content": "You are a careful assistant. Answer briefly."},
        {"role": "user", "content": "Name three prime numbers."}]}),
    ("multi_turn_think", {"messages": [
        {"role": "user", "content": "Hi there!"},
        {"role": "assistant", "content": "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?"},
        {"role": "user", "content": "Add 2 and 3."}]}),
    ("assistant_last_think", {"messages": [
        {"role": "user", "content": "Add 2 and 3."},
        {"role": "assistant", "content": "<think>\n2 + 3 = 5\n</think>\n\nThe sum is 5."}]}),
    ("reasoning_field_alias", {"messages": [
        {"role": "user", "content": "Add 2 and 3."},
        {"role": "assistant", "content": "The sum is 5.", "reasoning": "  two plus three is five  "}]}),
    ("list_content", {"messages": [
        {"role": "system", "content": [{"type": "text", "text": "Be terse."}]},
        {"role": "user", "content": [{"type": "text", "text": "Describe the layer"},
                                      {"type": "text", "text": " in one line."}]}]}),
    ("user_list_content", {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "Summarise:"}, {"type": "text", "text": " the residual stream."}]}]}),
    ("null_fields_dropped", {"messages": [
        {"role": "user", "content": "Hello", "name": None},
        {"role": "assistant", "content": "Hi.", "reasoning_content": None, "tool_calls": None},
        {"role": "user", "content": "Again."}]}),
    ("control_token_in_text", {"messages": [
        {"role": "user", "content": "Say <|im_end|> then <think> verbatim."}]}),
    ("unicode_nfc", {"messages": [
        {"role": "user", "content": "Cafe\u0301 na\u00efve \u2014 \u00fcber \u65e5\u672c \U0001F600\ttab"}]}),
    ("tools_and_tool_calls", {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"type": "function", "function": {
                 "name": "get_weather",
                 "arguments": {"city": "Paris", "days": 3, "metric": True, "hours": [6, 12],
                               "opts": {"lang": "fr", "note": "d\u00e9j\u00e0 <b>"}, "ratio": 0.5}}}]},
            {"role": "tool", "content": "sunny, 21 C"},
            {"role": "user", "content": "Thanks."}],
        "tools": [WEATHER_TOOL]}),
    ("image_in_user", {"messages": [
        {"role": "user", "content": [{"type": "image", "image": "cat.png"}, {"type": "text", "text": "What is this?"},
                                     {"type": "image_url", "image_url": {"url": "dog.png"}}]}]}),
    ("image_in_system", {"messages": [
        {"role": "system", "content": [{"type": "image", "image": "cat.png"}]},
        {"role": "user", "content": "Hello"}]}),
    ("unknown_role", {"messages": [
        {"role": "user", "content": "Hello"},
        {"role": "narrator", "content": "A pause."}]}),
    ("system_not_first", {"messages": [
        {"role": "user", "content": "Hello"},
        {"role": "system", "content": "Late system."}]}),
    ("no_user_turn", {"messages": [{"role": "system", "content": "Only a system turn."}]}),
]

# The toy pairs: the same shapes in the toy alphabet (' ', ':', 0-9, a-z); the think block of an
# assistant turn comes as a reasoning field (the alphabet has no '<').
TOY_CONVERSATIONS = [
    ("single_user", {"messages": [{"role": "user", "content": "count 347: 347 348"}]}),
    ("system_user", {"messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "walk q 1: q r s"}]}),
    ("multi_turn_think", {"messages": [
        {"role": "user", "content": "say zorb: zorb"},
        {"role": "assistant", "content": "zorb zorb", "reasoning_content": "repeat it"},
        {"role": "user", "content": "pair ox: ox1 ox2"}]}),
    ("assistant_last_think", {"messages": [
        {"role": "user", "content": "fizz 58: 58 59"},
        {"role": "assistant", "content": "fizzbuzz 61", "reasoning_content": " next is 60 "}]}),
    ("reasoning_field_alias", {"messages": [
        {"role": "user", "content": "count 12: 12 13"},
        {"role": "assistant", "content": "14 15", "thinking": "add one"}]}),
    ("list_content", {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "count 5: "}, {"type": "text", "text": "5 6"}]}]}),
    ("null_fields_dropped", {"messages": [
        {"role": "user", "content": "say ab: ab", "name": None},
        {"role": "assistant", "content": None, "reasoning_content": None},
        {"role": "user", "content": "say cd: cd"}]}),
    ("unknown_role", {"messages": [
        {"role": "user", "content": "count 1: 1 2"},
        {"role": "narrator", "content": "a pause"}]}),
    ("system_not_first", {"messages": [
        {"role": "user", "content": "count 1: 1 2"},
        {"role": "system", "content": "late"}]}),
    ("no_user_turn", {"messages": [{"role": "system", "content": "only system"}]}),
]

THINKING = [("unset", {}), ("true", {"enable_thinking": True}), ("false", {"enable_thinking": False})]

CHAT_FIXTURES = [
    # (name, checkpoint dir, template source, conversations)
    ("tiny-qwen3_5", "fixtures/tiny-qwen3_5", "qwen3_5.jinja", CONVERSATIONS),
    ("tiny-qwen3", "fixtures/tiny-qwen3", "qwen3.jinja", CONVERSATIONS),
    ("toy-pair", "fixtures/toy-pair/target", "toy.jinja", TOY_CONVERSATIONS),
    ("toy-pair-qwen3", "fixtures/toy-pair-qwen3/target", "toy.jinja", TOY_CONVERSATIONS),
]


def log(*a):
    print(*a, flush=True)


def sha256_file(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n")


def jsonl_line(conv: dict) -> str:
    return json.dumps(conv, ensure_ascii=False)


def install_template(ckpt: Path, template: str) -> None:
    shutil.copyfile(TEMPLATES / template, ckpt / "chat_template.jinja")


def chat_goldens(name: str, ckpt_rel: str, template: str, conversations) -> dict:
    import jinja2
    import transformers
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    ckpt = REPO / ckpt_rel
    assert (ckpt / "chat_template.jinja").read_bytes() == (TEMPLATES / template).read_bytes(), ckpt
    tok = AutoTokenizer.from_pretrained(str(ckpt))
    assert tok.chat_template == (TEMPLATES / template).read_text(), "chat_template.jinja must be the template"
    raw = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    cases = []
    all_match = True
    for case, conv in conversations:
        line = jsonl_line(conv)
        for flag, kw in THINKING:
            entry = {"name": case, "enable_thinking": flag, "line": line}
            args = dict(tools=conv.get("tools"), add_generation_prompt=True, **kw)
            try:
                text = tok.apply_chat_template(conv["messages"], tokenize=False, **args)
                enc = tok.apply_chat_template(conv["messages"], tokenize=True, **args)
                t_ids = list(enc["input_ids"])
            except Exception as e:  # noqa: BLE001 -- the template's rejection is the golden
                entry.update({"text": None, "ids": None, "transformers_ids": None,
                              "error": {"type": type(e).__name__, "message": str(e)}})
                cases.append(entry)
                continue
            ids = raw.encode(text, add_special_tokens=False).ids
            assert raw.encode(text, add_special_tokens=True).ids == ids, "no post-processor tokens"
            all_match &= ids == t_ids
            entry.update({"text": text, "ids": ids, "transformers_ids": t_ids, "error": None})
            cases.append(entry)
    note = None
    if not all_match:
        note = ("transformers_ids differ from ids: AutoTokenizer builds %s for this checkpoint and replaces the "
                "tokenizer.json pre-tokenizer with its own; ids are what tokenizer.json (and hsparity) encode"
                % type(tok).__name__)
    out = {
        "fixture": name,
        "checkpoint": ckpt_rel,
        "tool_version": f"transformers {transformers.__version__}",
        "jinja2_version": jinja2.__version__,
        "tokenizer_class": type(tok).__name__,
        "special_tokens_map": tok.special_tokens_map,
        "template": {"file": f"{ckpt_rel}/chat_template.jinja", "sha256": sha256_file(ckpt / "chat_template.jinja"),
                     "copied_from": f"tools/chat_templates/{template}"},
        "render": "tokenizer.apply_chat_template(messages, tools=line.get('tools'), add_generation_prompt=True, "
                  "tokenize=False[, enable_thinking=...])",
        "ids": "tokenizers.Tokenizer.from_file(checkpoint/tokenizer.json).encode(text, add_special_tokens=False)",
        "transformers_ids": "tokenizer.apply_chat_template(..., tokenize=True)['input_ids']",
        "transformers_ids_match_tokenizer_json": all_match,
        "note": note,
        "cases": cases,
    }
    return out


# ------------------------------------------------------------------------------------------------
# Template lookup (transformers 5.23.0 tokenization_utils_base.py: from_pretrained collects
# chat_template.jinja and additional_chat_templates/*.jinja, _from_pretrained lets them override the
# tokenizer_config.json key; __init__ turns a list of {name, template} into a dict; get_chat_template
# picks by name, else "tool_use" when tools are given, else "default")
# ------------------------------------------------------------------------------------------------
LOOKUP_CASES = [
    ("config_key_only", {"tokenizer_config.json:chat_template": "{{- 'CONFIG' }}"}),
    ("jinja_file_overrides_config_key", {"tokenizer_config.json:chat_template": "{{- 'CONFIG' }}",
                                         "chat_template.jinja": "{{- 'FILE' }}"}),
    ("jinja_file_only", {"chat_template.jinja": "{{- 'FILE' }}\n"}),
    ("config_list_picks_default", {"tokenizer_config.json:chat_template": [
        {"name": "tool_use", "template": "{{- 'TOOLS' }}"}, {"name": "default", "template": "{{- 'DEFAULT' }}"}]}),
    ("config_list_without_default", {"tokenizer_config.json:chat_template": [
        {"name": "rag", "template": "{{- 'RAG' }}"}, {"name": "tool_use", "template": "{{- 'TOOLS' }}"}]}),
    ("additional_templates_with_default_file", {"chat_template.jinja": "{{- 'FILE' }}",
                                                "additional_chat_templates/tool_use.jinja": "{{- 'EXTRA TOOLS' }}",
                                                "additional_chat_templates/rag.jinja": "{{- 'EXTRA RAG' }}"}),
    ("additional_templates_replace_config_key", {"tokenizer_config.json:chat_template": "{{- 'CONFIG' }}",
                                                 "additional_chat_templates/rag.jinja": "{{- 'EXTRA RAG' }}"}),
    ("additional_default_named_file", {"additional_chat_templates/default.jinja": "{{- 'EXTRA DEFAULT' }}"}),
    ("no_template", {}),
]


def lookup_goldens(tok_src: Path) -> dict:
    import transformers
    from transformers import AutoTokenizer

    cases = []
    base_cfg = json.loads((tok_src / "tokenizer_config.json").read_text())
    for name, files in LOOKUP_CASES:
        with tempfile.TemporaryDirectory() as d:
            d = Path(d)
            shutil.copyfile(tok_src / "tokenizer.json", d / "tokenizer.json")
            cfg = dict(base_cfg)
            written = {}
            for rel, content in files.items():
                if rel == "tokenizer_config.json:chat_template":
                    cfg["chat_template"] = content
                    continue
                (d / rel).parent.mkdir(parents=True, exist_ok=True)
                (d / rel).write_text(content)
                written[rel] = content
            (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
            tok = AutoTokenizer.from_pretrained(str(d))
            entry = {"name": name, "files": written, "tokenizer_config_chat_template": cfg.get("chat_template"),
                     "chat_template": tok.chat_template}
            for label, tools in (("selected", None), ("selected_with_tools", [WEATHER_TOOL])):
                try:
                    entry[label] = {"template": tok.get_chat_template(None, tools), "error": None}
                except ValueError as e:
                    entry[label] = {"template": None, "error": str(e)}
            cases.append(entry)
    return {"tool_version": f"transformers {transformers.__version__}",
            "how": "AutoTokenizer.from_pretrained(dir) on a copy of fixtures/tiny-qwen3's tokenizer with the files "
                   "below; chat_template = tokenizer.chat_template; selected = tokenizer.get_chat_template(None, "
                   "tools) with tools None / [one tool]",
            "cases": cases}


# ------------------------------------------------------------------------------------------------
# Benchmark prompt sets, as z-lab/dflash dflash/benchmark.py (blob of commit 1fe684b0) formats them
# ------------------------------------------------------------------------------------------------
# DATASETS[name]["format"], verbatim from benchmark.py L28-L55 (applied to the HF rows there; here to the
# upstream files those HF datasets publish, see data/prompt-sets/*/SOURCE.md).
ZLAB_FORMAT = {
    "gsm8k": lambda x: "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}.".format(**x),
    "math500": lambda x: "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}.".format(**x),
    "humaneval": lambda x: "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{prompt}\n```".format(**x),
    "mbpp": lambda x: x["prompt"],
    "mt-bench": lambda x: x["prompt"],
}
ZLAB_MULTI_TURN = {"mt-bench"}
SETS = ["gsm8k", "humaneval", "math500", "mt-bench", "mbpp"]


def read_rows(name: str) -> list[dict]:
    """The HF split's rows in row order, from the files in data/prompt-sets/<name>/."""
    if name == "gsm8k":
        return [json.loads(x) for x in (DATA / "gsm8k" / "test.jsonl").read_text().splitlines() if x.strip()]
    if name == "math500":
        return [json.loads(x) for x in (DATA / "math500" / "test.jsonl").read_text().splitlines() if x.strip()]
    if name == "humaneval":
        return [json.loads(x) for x in (DATA / "humaneval" / "HumanEval.jsonl").read_text().splitlines() if x.strip()]
    if name == "mbpp":
        # HF google-research-datasets/mbpp "sanitized" split "test" = task_id 11..510 (MBPP README splits)
        rows = json.loads((DATA / "mbpp" / "sanitized-mbpp.json").read_text())
        rows = [r for r in rows if 11 <= r["task_id"] <= 510]
        assert [r["task_id"] for r in rows] == sorted(r["task_id"] for r in rows)
        return rows
    if name == "mt-bench":
        # HF HuggingFaceH4/mt_bench_prompts "prompt" = FastChat question.jsonl "turns"
        rows = [json.loads(x) for x in (DATA / "mt-bench" / "question.jsonl").read_text().splitlines() if x.strip()]
        return [dict(r, prompt=r["turns"]) for r in rows]
    raise KeyError(name)


def zlab_turns(name: str, row: dict) -> list[str]:
    """benchmark.py _prepare_dataset L71-L74: multi-turn sets keep the list, the others get [format(row)]."""
    return ZLAB_FORMAT[name](row) if name in ZLAB_MULTI_TURN else [ZLAB_FORMAT[name](row)]


def zlab_limit(dataset: list, max_samples, seed: int = 0) -> list:
    """benchmark.py _limit_dataset (L96-L100) after random.seed(0) (L207, transformers backend)."""
    random.seed(seed)
    dataset = list(dataset)
    if max_samples is None or len(dataset) <= max_samples:
        return dataset
    random.shuffle(dataset)
    return dataset[:max_samples]


def shuffle_file() -> dict:
    out = {
        "generated_with": f"CPython {sys.version.split()[0]}: random.seed(S); x = list(range(N)); random.shuffle(x)",
        "what": "x[i] is the 0-based row (in the data file's row order) at position i after z-lab/dflash "
                "benchmark.py _limit_dataset shuffles a set of N rows; --max-samples M keeps x[:M] when N > M. "
                "Seed 0: transformers backend (random.seed(0) at L207); seed 42: module-level random.seed(42) "
                "(L23), the state the mlx backend shuffles from. Blob of z-lab/dflash commit 1fe684b0.",
        "sets": {},
    }
    for name in SETS:
        n = len(read_rows(name))
        perms = {}
        for seed in (0, 42):
            random.seed(seed)
            x = list(range(n))
            random.shuffle(x)
            perms[f"seed_{seed}"] = x
        out["sets"][name] = {"rows": n, **perms}
    return out


def prompt_set_goldens(render_ckpt_rel: str) -> dict:
    import transformers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(REPO / render_ckpt_rel))
    sets = {}
    for name in SETS:
        rows = read_rows(name)
        dataset = [{"row": i, "turns": zlab_turns(name, r)} for i, r in enumerate(rows)]
        head = dataset[:3]
        sample = zlab_limit(dataset, 4)
        full = zlab_limit(dataset, len(dataset))
        assert full == dataset
        rendered = []
        for item in sample[:2]:
            for flag in (False, True):
                # benchmark.py L238-L241: messages = [{"role": "user", "content": turn}], the first turn
                messages = [{"role": "user", "content": item["turns"][0]}]
                text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                               enable_thinking=flag)
                ids = tok.encode(text)
                assert ids == tok.encode(text, add_special_tokens=False)
                rendered.append({"row": item["row"], "enable_thinking": flag, "text": text, "ids": ids})
        sets[name] = {"rows": len(rows), "first_rows": head, "max_samples_4": sample, "rendered_max_samples_4": rendered}
    return {
        "benchmark": "z-lab/dflash dflash/benchmark.py, blob of commit 1fe684b00efba56490d920d15eeb9ba6e4471751 "
                     "(main 44947fbf): DATASETS format L28-L55, turns L71-L74, _limit_dataset L96-L100 after "
                     "random.seed(0) L207, _apply_chat_template L103-L109, tokenizer.encode L241",
        "tool_version": f"transformers {transformers.__version__}",
        "rendered_with": render_ckpt_rel,
        "first_rows": "the first 3 rows, unshuffled (--max-samples unset, or >= the set's size)",
        "max_samples_4": "--max-samples 4: random.seed(0); random.shuffle(rows); rows[:4]",
        "rendered_max_samples_4": "the first 2 of max_samples_4, first turn, enable_thinking False (benchmark "
                                  "default) and True (--enable-thinking); ids = tokenizer.encode(text)",
        "sets": sets,
    }


def main() -> None:
    import transformers

    if transformers.__version__ != "5.23.0":
        sys.exit(f"need transformers 5.23.0, have {transformers.__version__}")
    for _, ckpt_rel, template, _ in CHAT_FIXTURES:
        if template == "toy.jinja":
            install_template(REPO / ckpt_rel, template)
    write_json(DATA / "zlab_shuffle.json", shuffle_file())
    for name, ckpt_rel, template, convs in CHAT_FIXTURES:
        g = chat_goldens(name, ckpt_rel, template, convs)
        if name.startswith("tiny-"):
            assert g["transformers_ids_match_tokenizer_json"], name
        write_json(CHAT_OUT / f"{name}.json", g)
        errs = sum(c["error"] is not None for c in g["cases"])
        log(f"chat goldens {name}: {len(g['cases'])} cases ({errs} raised), class {g['tokenizer_class']}, "
            f"special tokens {g['special_tokens_map']}, transformers ids match tokenizer.json: "
            f"{g['transformers_ids_match_tokenizer_json']}")
    write_json(CHAT_OUT / "lookup.json", lookup_goldens(REPO / "fixtures" / "tiny-qwen3"))
    ps = prompt_set_goldens("fixtures/tiny-qwen3_5")
    write_json(CHAT_OUT / "prompt-sets.json", ps)
    for name, s in ps["sets"].items():
        log(f"prompt set {name}: {s['rows']} rows, max_samples 4 -> rows {[x['row'] for x in s['max_samples_4']]}")


if __name__ == "__main__":
    main()
