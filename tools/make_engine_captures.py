#!/usr/bin/env python3
"""Write ``fixtures/engine-captures/``: hidden-state files as SpecForge, vLLM and SGLang write them.

CI never runs this script; its outputs are committed and ``tests/import.rs`` / ``tests/align.rs`` read
them. SpecForge, vLLM and SGLang need GPUs and cannot run here, so the *values* come from transformers
5.23.0 runs of the bundled fixtures and the *files* are written the way each engine's writer writes
them: the same keys, dtypes, shapes, padding, file and folder names, container (torch zip pickle,
gzip, safetensors, JSON) and, the point of the exercise, each engine's own layer-index convention.

    .venv/bin/python tools/make_engine_captures.py      # ~15 s on CPU; deterministic (byte-identical reruns)

transformers' convention (hsparity's): ``hs[i]`` = ``output_hidden_states[i]``; ``hs[0]`` the embeddings,
``hs[l+1]`` the output of decoder layer l (pre-norm residual stream), ``hs[N]`` the FINAL-NORMED output.
The raw output of the last layer (before the final norm) is no ``hs`` index at all; it is the golden
dumps' ``last_layer_output``.

Sources of the tiny values: ``fixtures/tiny-qwen3_5`` (N = 6, H = 64) through ``AutoModelForCausalLM``
in float32, eager attention, the two prompts of its ``prompts.jsonl`` (their lengths are in the manifest's
``tiny.prompts``); every
captured tensor is the float32 state rounded to bfloat16 (the engines capture in the model dtype,
bf16 for Qwen3.5; rounding the fp32 state instead of computing in bf16 keeps the files comparable
with the float32 goldens ``fixtures/tiny-qwen3_5/golden/causal-lm.safetensors`` to one bf16 rounding).
The toy-pair record comes from ``fixtures/toy-pair/target`` in its own dtype (bf16) as
``AutoModelForCausalLM`` computes it, i.e. the ``causal-lm`` loading path.

What each file holds, and which ``hs`` index every stored layer is, goes to ``manifest.json``. The
index is never typed in: the generator finds it by comparing every stored slice with all of the
transformers states of the same tokens (``hs[0..N]`` and ``last_layer_output``) and records the nearest,
with the evidence (``identification``): the distance to the golden rounded to bf16, in bf16 ulps of the
row's scale, must be 0 (bitwise) where the engine ran the unpadded sequence and at most 1 where it ran a
right-padded batch (the padded forward differs from the unpadded one by f32 round-off, so after the bf16
rounding an element may land on the neighbouring bf16 value), and the runner-up must be at least
``MARGIN_REL_L2`` away in relative L2. Whether each stored layer is bitwise is recorded.

Writers reproduced (repository, file, function, commit; "stored copy" = read in a stored copy whose
commit is not pinned):

SpecForge offline capture, DFlash (``specforge-dflash/``, ``specforge-dflash-compressed/``)
    sgl-project/SpecForge ``scripts/prepare_hidden_states.py`` ``HiddenStatesGenerator._save_tensor_sync``
    (stored copy with ``--compress`` / ``--compression-level``; the ``--strategy`` era): one
    ``torch.save(dict)`` per sample at ``{out}/rows_{g}-{g+2000}/data_{idx}.ckpt`` (``_get_file_path``,
    ``--file-group-size`` 2000), or ``gzip.open(path, "wb", compresslevel=6)`` + ``torch.save`` named
    ``data_{idx}.ckpt.gz`` with ``--compress``. DFlash record keys (``specforge/algorithms/dflash/
    providers.py``, @27f34fe0: ``{"input_ids", "loss_mask", "hidden_states"}``, aux feature
    ``hidden_states``, no last hidden state): ``input_ids`` [T] int64, ``loss_mask`` [T] int64,
    ``hidden_states`` [1, T, k*H] bf16 = the ``target_layer_ids`` taps ``torch.cat(dim=-1)`` in order.
    The batch is right-padded with zeros to the batch maximum (``DataCollatorWithPadding.paddingtensor2D``,
    ``specforge/data/utils.py`` @01dd7144) and the *padded* row is what the SGLang capture runs
    (``OfflineSGLangCaptureBackend.capture_eagle3``: ``origin_input_ids=input_row.view(-1).tolist()``,
    ``specforge/offline_capture/sglang_backend/capture.py`` @e630ca4e), so a short sample ends in
    id-0 / loss_mask-0 rows whose hidden states are real forward outputs on token 0. Here p0 and p1 form
    one batch: p0 is padded to p1's length (``specforge.batch_padded_to``). Layer convention: SGLang ``set_dflash_layers_to_capture``
    stores ``layers_to_capture = [L + 1 for L in layer_ids]`` ("SGLang captures 'before layer i'";
    sgl-project/sglang ``python/sglang/srt/models/qwen3.py``), so tap L is ``hs[L + 1]``.
SpecForge offline capture, EAGLE-3 (``specforge-eagle3/``)
    sgl-project/SpecForge ``scripts/prepare_hidden_states.py`` @f1424fb6 ``HiddenStatesGenerator.generate``
    / ``_save_tensor_sync``: ``torch.save(asdict(DataPoint))`` with ``input_ids`` [T], ``loss_mask`` [T],
    ``hidden_state`` [1, T, H] (the tensor fed to the LM head: final-normed ``hs[N]``) and
    ``aux_hidden_state`` [1, T, 3H] (``--aux-hidden-states-layers 0,2,4``; SGLang's
    ``set_eagle3_layers_to_capture`` adds 1, so ``hs[1], hs[3], hs[5]``). One sample (p0), batch size 1.
vLLM ``extract_hidden_states`` (``vllm/``, ``vllm-legacy-layout/``, ``vllm-misindexed/``)
    vllm-project/vllm ``vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py``
    ``ExampleHiddenStatesConnector.save_kv_layer`` / ``build_connector_meta``: one
    ``safetensors.torch.save_file({"hidden_states", "token_ids"}, f"{shared_storage_path}/{req_id}.safetensors")``
    per request, ``token_ids`` = ``torch.tensor(prompt_token_ids)`` (int64). ``hidden_states`` layout:
    [T, L, H] in current vLLM (``examples/offline_inference/extract_hidden_states.py``, stored copy
    with ``include_output_tokens``: "[num_tokens, num_extracted_layers, hidden_size]"; the online
    connector's example @e6878fb6: "[prompt_len, num_layers, hidden_size]") and [L, T, H] in the older
    connector (@806715ec: ``torch.stack(hidden_states, dim=0)``; its example @6ff11aca:
    "[num_hidden_layers, prompt len, hidden size]") -> ``vllm-legacy-layout/``. Layer convention
    (``EagleModelMixin._maybe_add_hidden_state`` in ``vllm/model_executor/models/interfaces.py`` and the
    model loops ``_maybe_add_hidden_state([], 0, h, residual)`` ... ``idx + 1`` after layer idx, value
    ``h + residual``; stored copies): aux id k is ``hs[k]`` (0 = embeddings) and id N is the last
    layer's output BEFORE the final norm. ``eagle_aux_hidden_state_layer_ids`` = [0, 2, 4, 6] here.
    ``vllm-misindexed/``: the blanket +1 bug: the run was configured (and is declared in the
    manifest) with ids [1, 2, 3, 4], but the connector captured [2, 3, 4, 5].
SGLang dumper (``sglang-dump/``)
    sgl-project/sglang ``python/sglang/srt/debug_utils/dumper.py`` (stored copy of the ``DUMPER_*`` /
    ``exp_name`` / ``step`` generation) ``_Dumper._dump_single``: ``torch.save({"value": tensor,
    "meta": {**full_kwargs, **static_meta}})`` at ``{DUMPER_DIR}/{DUMPER_EXP_NAME}/`` +
    ``"___".join(f"{k}={v}")`` of ``step, rank, dump_index, name, recompute_status, <ctx>`` + ``.pt``;
    ``_NonIntrusiveDumper`` (``DUMPER_NON_INTRUSIVE_MODE=all``) names module outputs
    ``non_intrusive__{module}.output[.{i}]`` (tuple outputs by position) and sets the ``layer_id`` ctx
    for everything under ``...layers.{N}``. Emulated run: TP = 2 (both ranks write; the residual stream
    is replicated), ``DUMPER_EXP_NAME=hsparity_fixture``, a filter passing ``input_ids``, ``positions``,
    ``embed_tokens.output`` (= hs[0]), ``layers.2.input_layernorm.output.1`` (the fused add-norm's
    residual sum entering layer L = hs[L]), ``norm.output.0`` (= hs[N]) and ``norm.output.1`` (the
    pre-norm last layer output); request p0 with ``max_new_tokens=2``: step 0 prefill (the prompt alone),
    step 1 one decode token (the second sampled token is never fed), each row from the forward the engine
    runs for it (``served``: the prefill over the prompt, a decode row as the last row of a forward over the
    tokens fed so far). Module names are
    SGLang's Qwen3-family ``model.embed_tokens`` / ``model.layers.{i}`` / ``model.norm``.
SGLang ``/generate`` with ``return_hidden_states`` (``sglang-json/``)
    ``request.json``: ``{"input_ids", "sampling_params", "return_hidden_states": true}`` (server started
    with ``--enable-return-hidden-states``); ``response.json``: ``text``, ``output_ids``, ``meta_info``
    with ``hidden_states`` = ``[prefill rows [T][H], one [H] row per decode step]`` (scheduler output
    processor: ``logits_output.hidden_states[...].cpu().tolist()``), the tensor fed to the LM head:
    final-normed ``hs[N]``. p0 with ``max_new_tokens=3`` (the prompt's rows + 2 decode rows, ``served``).
SpecForge DFlash training record of the toy pair (``toy-pair-specforge/``)
    the DFlash record above for ``fixtures/toy-pair`` (N = 4, H = 64, taps from
    ``fixtures/toy-pair/drafter/config.json`` ``dflash_config.target_layer_ids``) over prompt + the
    target's greedy response (max_new_tokens + block_size = 72 tokens, so that a replay of 64 new tokens
    can verify full blocks to the end; the first 64 asserted equal to ``golden/reference_tau.json``'s
    ``causal-lm`` trajectories), ``loss_mask`` 1 on the response, one record per prompt for prompts
    0, 1, 2, 3 and 12 of ``fixtures/toy-pair/prompts.jsonl`` (one per corpus family; all 15 would be
    390 KB), ``data_{i}.ckpt`` with i the prompt's index there, ``--batch-size 1`` (no padding), bf16 as
    computed. The reference of ``drafter --features`` is computed here (``tau_on_record``): the dflash
    0.1.0 ``DFlashDraftModel`` (bf16) replayed with the GitHub-main rule on the record's own taps over the
    record's own tokens, drafting through the target's embeddings and LM head; its acceptance lengths and
    tau go to the manifest next to the golden ``causal-lm`` ones of ``reference_tau.json`` (the Python
    DFlash loop with full target re-forwards), and ``toy_pair.records_equal_golden_causal_lm_rounds``
    says whether every round is the same.

Determinism: one thread, fixed inputs, ``torch.save`` (its ``serialization_id`` is a content hash),
gzip header ``mtime=0``, ``safetensors.torch.save_file`` without metadata, JSON with sorted keys
where the engine's key order does not matter.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

import transformers  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import forward_dump, load, setup_determinism, write_json  # noqa: E402
from train_toy_pair import BLOCK, DFlashDraftModel, draft_logits_for  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
OUT_REL = "fixtures/engine-captures"
TINY = "fixtures/tiny-qwen3_5"
TOY = "fixtures/toy-pair"
EXPECTED_TRANSFORMERS = "5.23.0"

DFLASH_TAPS = [1, 3]  # SpecForge --draft-model-config target_layer_ids for the tiny target (N = 6)
EAGLE3_AUX = [0, 2, 4]  # SpecForge --aux-hidden-states-layers
VLLM_IDS = [0, 2, 4, 6]  # eagle_aux_hidden_state_layer_ids: embeddings, two middles, N (pre-norm)
VLLM_DECLARED = [1, 2, 3, 4]  # what the mis-indexed run was configured with
VLLM_BUGGY = [k + 1 for k in VLLM_DECLARED]  # what it captured (blanket +1)
SGLANG_LAYERS = [2]  # input_layernorm.output.1 of these layers (= hs[L])
SGLANG_TP = 2
SGLANG_EXP = "hsparity_fixture"
NEW_TOKENS = 3  # SGLang /generate request: max_new_tokens
DUMP_NEW_TOKENS = 2  # SGLang dumper run: max_new_tokens (one prefill step, one decode step)
TOY_PROMPTS = [0, 1, 2, 3, 12]  # one prompt per corpus family (count, walk, say, pair, fizz)
FILE_GROUP = 2000


def log(*a):
    print(*a, flush=True)


def rel(p: Path) -> str:
    return str(p.relative_to(REPO))


def bf16(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.bfloat16).contiguous()


def rows_dir(root: Path, idx: int) -> Path:
    g = (idx // FILE_GROUP) * FILE_GROUP
    return root / f"rows_{g}-{g + FILE_GROUP}"


def torch_save(obj, path: Path, compress: bool = False):
    path.parent.mkdir(parents=True, exist_ok=True)
    if compress:
        # SpecForge: gzip.open(output_file, "wb", compresslevel=6); GzipFile with mtime=0 writes the same
        # stream with a fixed header timestamp (the only field gzip.open would fill from the clock).
        with open(path, "wb") as raw, gzip.GzipFile(filename=path.name, mode="wb", compresslevel=6,
                                                     fileobj=raw, mtime=0) as f:
            torch.save(obj, f)
    else:
        torch.save(obj, path)


# Identification (see the module docstring): the stored slice is matched against every transformers state of
# the same tokens; the nearest one must lie within the bound of the golden rounded to bf16 in every element
# (0 = bitwise where the engine ran the unpadded sequence; 1 bf16 ulp of the row's scale where it ran a padded
# batch), and the runner-up must be at least MARGIN_REL_L2 away in relative L2 (the bf16 rounding alone is
# below 2^-8).
MARGIN_REL_L2 = 1e-2


def row_ulp(golden: torch.Tensor) -> torch.Tensor:
    """[T, 1]: the bf16 spacing at each row's largest |value| (one bf16 ulp of the row's scale)."""
    m = golden.abs().amax(dim=-1, keepdim=True).clamp_min(2.0 ** -126)
    return torch.exp2(torch.floor(torch.log2(m)) - 7)


def bf16_ulps(stored: torch.Tensor, golden: torch.Tensor) -> float:
    """max over elements of |stored - bf16(golden)| in bf16 ulps of the row's scale (``row_ulp``). The padded
    forward's f32 round-off is absolute (about 2^-21 of the row's scale), so an element much smaller than its
    row can move by several of its own ulps, never by one of the row's."""
    return ((stored.float() - bf16(golden).float()).abs() / row_ulp(golden)).max().item()


def rel_l2(stored: torch.Tensor, golden: torch.Tensor) -> float:
    return ((stored.float() - golden).norm() / golden.norm().clamp_min(1e-30)).item()


class Reference:
    """transformers states of one token sequence: hs[0..N] and the raw last layer output, float32 [T, H]."""

    def __init__(self, hs: list[torch.Tensor], last: torch.Tensor, logits: torch.Tensor | None = None):
        self.hs, self.last, self.logits = hs, last, logits

    def candidates(self):
        for i, h in enumerate(self.hs):
            yield i, h
        yield "last_layer_output", self.last

    def identify(self, stored: torch.Tensor, rows, padded: bool = False) -> tuple[int | str, dict]:
        """The transformers state nearest to ``stored`` (bf16) over ``rows`` (a prefix length or a list of row
        indices), with the evidence: bitwise or not, its distance in bf16 ulps of the row's scale, the runner-up and
        its margin. Asserts the bound (0 = bitwise unpadded, 1 padded) and the margin."""
        sel = (lambda h: h[:rows]) if isinstance(rows, int) else (lambda h: h[rows])
        s = stored[:rows] if isinstance(rows, int) else stored
        scored = sorted(((bf16_ulps(s, sel(h)), rel_l2(s, sel(h)), name) for name, h in self.candidates()),
                        key=lambda x: (x[0], x[1]))
        (ulps, l2, best), (r_ulps, r_l2, runner) = scored[0], scored[1]
        bound = 1 if padded else 0
        assert ulps <= bound, f"nearest state {best} is {ulps} bf16 ulps away (bound {bound})"
        assert r_l2 >= MARGIN_REL_L2 and l2 < 2.0 ** -8, f"{best} (rel L2 {l2}) vs runner-up {runner} ({r_l2})"
        g = bf16(sel(dict(self.candidates())[best]))
        differing = int((s.to(torch.bfloat16) != g).sum().item())
        return best, {"bitwise": differing == 0, "elements_not_bitwise": differing,
                      "max_abs_diff": (s.float() - g.float()).abs().max().item(),
                      "max_row_scale_bf16_ulps": ulps, "bound_row_scale_bf16_ulps": bound, "rel_l2": round(l2, 8),
                      "runner_up": runner, "runner_up_rel_l2": round(r_l2, 6),
                      "runner_up_max_row_scale_bf16_ulps": round(r_ulps, 1)}


def identified(pairs) -> dict:
    """``{"stored_layers": {name: index}, "identification": {name: evidence}}`` from (name, identify result)."""
    pairs = list(pairs)
    return {"stored_layers": {n: r[0] for n, r in pairs}, "identification": {n: r[1] for n, r in pairs}}


@torch.no_grad()
def reference(model, ids: list[int], n_layers: int) -> Reference:
    t, _ = forward_dump(model, [ids], n_layers)
    return Reference([t[f"p0.hidden_states.{i}"] for i in range(n_layers + 1)], t["p0.last_layer_output"],
                     t.get("p0.logits"))


def greedy(model, ids: list[int], n: int, n_layers: int) -> list[int]:
    seq = list(ids)
    for _ in range(n):
        seq.append(int(torch.argmax(reference(model, seq, n_layers).logits[-1]).item()))
    return seq[len(ids):]


def served(model, fed: list[int], prompt_len: int, n_layers: int) -> Reference:
    """The states a serving engine computes for ``fed``: the prefill rows from a forward over the prompt alone
    (bitwise the golden), then each decode row r from a forward over ``fed[:r + 1]`` (its last row; the engine's
    cached decode step computes that row)."""
    parts = [reference(model, fed[:prompt_len], n_layers)]
    parts += [reference(model, fed[:r + 1], n_layers) for r in range(prompt_len, len(fed))]
    rows = [p.hs for p in parts[:1]] + [[h[-1:] for h in p.hs] for p in parts[1:]]
    hs = [torch.cat([r[i] for r in rows]) for i in range(n_layers + 1)]
    last = torch.cat([parts[0].last] + [p.last[-1:] for p in parts[1:]])
    return Reference(hs, last)


def tensor_info(t) -> dict:
    return {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape)}


# ------------------------------------------------------------------------------------------------
# SpecForge
# ------------------------------------------------------------------------------------------------
def specforge_records(model, prompts, n_layers, H):
    """DFlash records for one batch of all prompts (right-padded), plus the manifest entries."""
    T = max(len(p) for p in prompts)
    records, entries = [], []
    for idx, ids in enumerate(prompts):
        pad = T - len(ids)
        padded = list(ids) + [0] * pad  # DataCollatorWithPadding: zeros to the batch max
        ref = reference(model, padded, n_layers)
        true = reference(model, ids, n_layers)  # the unpadded sequence: what hsparity compares against
        taps = torch.cat([ref.hs[L + 1] for L in DFLASH_TAPS], dim=-1)
        loss_mask = [0] * (len(ids) // 2) + [1] * (len(ids) - len(ids) // 2) + [0] * pad
        rec = {
            "input_ids": torch.tensor(padded, dtype=torch.long),
            "loss_mask": torch.tensor(loss_mask, dtype=torch.long),
            "hidden_states": bf16(taps).cpu().clone().unsqueeze(0),
        }
        # the padded rows differ from the unpadded forward by f32 round-off (another T, other GEMM blocking), so
        # after the bf16 rounding a padded record is within one bf16 ulp of the golden, not bitwise
        found = identified((f"hidden_states[..., {j * H}:{(j + 1) * H}] (tap {L})",
                            true.identify(rec["hidden_states"][0, :, j * H:(j + 1) * H], len(ids), padded=pad > 0))
                           for j, L in enumerate(DFLASH_TAPS))
        prefix_equal = all(torch.equal(ref.hs[i][: len(ids)], true.hs[i]) for i in range(n_layers + 1))
        records.append(rec)
        entries.append({
            "prompt": idx, "tokens": len(ids), "padded_to": T, "trailing_padding": pad,
            "target_layer_ids": DFLASH_TAPS, **found,
            "padded_forward_prefix_bitwise_equal_to_unpadded": prefix_equal,
        })
    return records, entries


def write_specforge(model, prompts, n_layers, H, out: Path) -> list[dict]:
    records, entries = specforge_records(model, prompts, n_layers, H)
    files = []
    for compress, folder in ((False, "specforge-dflash"), (True, "specforge-dflash-compressed")):
        for idx, (rec, ent) in enumerate(zip(records, entries)):
            suffix = ".ckpt.gz" if compress else ".ckpt"
            path = rows_dir(out / folder, idx) / f"data_{idx}{suffix}"
            torch_save(rec, path, compress)
            files.append({
                "path": rel(path), "format": "specforge", "engine": "SpecForge offline capture (DFlash)",
                "container": "gzip of a torch zip pickle" if compress else "torch zip pickle",
                "keys": {k: tensor_info(v) for k, v in rec.items()}, **ent,
                "layer_convention": "SpecForge/SGLang tap L = hs[L+1]",
            })
    # EAGLE-3: p0 alone (batch size 1, no padding)
    ids = prompts[0]
    ref = reference(model, ids, n_layers)
    aux = torch.cat([ref.hs[L + 1] for L in EAGLE3_AUX], dim=-1)
    rec = {
        "input_ids": torch.tensor(ids, dtype=torch.long).clone(),
        "loss_mask": torch.tensor([0] * (len(ids) // 2) + [1] * (len(ids) - len(ids) // 2), dtype=torch.long),
        "hidden_state": bf16(ref.hs[n_layers]).cpu().clone().unsqueeze(0),
        "aux_hidden_state": bf16(aux).cpu().clone().unsqueeze(0),
    }
    path = rows_dir(out / "specforge-eagle3", 0) / "data_0.ckpt"
    torch_save(rec, path)
    found = identified([(f"aux_hidden_state[..., {j * H}:{(j + 1) * H}] (aux layer {L})", ref.identify(
        rec["aux_hidden_state"][0, :, j * H:(j + 1) * H], len(ids))) for j, L in enumerate(EAGLE3_AUX)]
        + [("hidden_state", ref.identify(rec["hidden_state"][0], len(ids)))])
    files.append({
        "path": rel(path), "format": "specforge", "engine": "SpecForge offline capture (EAGLE-3)",
        "container": "torch zip pickle", "keys": {k: tensor_info(v) for k, v in rec.items()},
        "prompt": 0, "tokens": len(ids), "trailing_padding": 0, "aux_hidden_states_layers": EAGLE3_AUX,
        **found,
        "layer_convention": "aux layer L = hs[L+1]; hidden_state = final-normed hs[N]",
    })
    return files


def write_toy_specforge(out: Path) -> list[dict]:
    toy = REPO / TOY
    draft_cfg = json.loads((toy / "drafter" / "config.json").read_text())
    taps = list(draft_cfg["dflash_config"]["target_layer_ids"])
    golden = json.loads((toy / "golden" / "reference_tau.json").read_text())
    max_new = golden["settings"]["max_new_tokens"]
    block = golden["settings"]["block_size"]
    assert golden["settings"]["target_layer_ids"] == taps and block == BLOCK
    draft = DFlashDraftModel.from_pretrained(str(toy / "drafter"), dtype=torch.bfloat16).eval()
    setup_determinism()
    model = AutoModelForCausalLM.from_pretrained(str(toy / "target"), dtype="auto",
                                                 attn_implementation="eager").eval()
    assert model.dtype == torch.bfloat16
    n_layers = model.config.num_hidden_layers
    H = model.config.hidden_size
    tok = Tokenizer.from_file(str(toy / "target" / "tokenizer.json"))
    prompts = [tok.encode(json.loads(line)["text"], add_special_tokens=False).ids
               for line in (toy / "prompts.jsonl").read_text().splitlines() if line.strip()]
    per_prompt = golden["paths"]["causal-lm"]["per_prompt"]
    assert len(per_prompt) == len(prompts)
    files = []
    for idx in TOY_PROMPTS:
        ids = prompts[idx]
        traj = per_prompt[idx]["trajectory"]
        assert per_prompt[idx]["num_tokens"] == len(ids) and len(traj) == max_new
        # the response holds max_new + B tokens: the replay's last anchors verify a full block past max_new
        resp = greedy(model, ids, max_new + block, n_layers)
        assert resp[:max_new] == traj, f"toy prompt {idx}: greedy response departs from reference_tau.json"
        seq = ids + resp
        ref = reference(model, seq, n_layers)
        rec = {
            "input_ids": torch.tensor(seq, dtype=torch.long),
            "loss_mask": torch.tensor([0] * len(ids) + [1] * len(resp), dtype=torch.long),
            "hidden_states": torch.cat([ref.hs[L + 1] for L in taps], dim=-1).to(torch.bfloat16)
            .cpu().clone().unsqueeze(0),
        }
        path = rows_dir(out / "toy-pair-specforge", idx) / f"data_{idx}.ckpt"
        torch_save(rec, path)
        found = identified((f"hidden_states[..., {j * H}:{(j + 1) * H}] (tap {L})", ref.identify(
            rec["hidden_states"][0, :, j * H:(j + 1) * H], len(seq))) for j, L in enumerate(taps))
        acc = tau_on_record(draft, model, rec, len(ids), max_new)
        files.append({
            "path": rel(path), "format": "specforge", "engine": "SpecForge offline capture (DFlash), training record",
            "container": "torch zip pickle", "keys": {k: tensor_info(v) for k, v in rec.items()},
            "prompt": idx, "prompt_tokens": len(ids), "response_tokens": len(resp), "tokens": len(seq),
            "trailing_padding": 0, "target_layer_ids": taps, **found,
            "checkpoint": TOY + "/target", "loading_path": "causal-lm", "dtype": "bf16 (as computed)",
            "num_layers": n_layers, "hidden_size": H, "block_size": block, "replay_max_new_tokens": max_new,
            "acceptance_lengths_on_record": acc, "tau_on_record": sum(acc) / len(acc),
            "golden_causal_lm_acceptance_lengths": per_prompt[idx]["acceptance_lengths"],
            "golden_causal_lm_tau": per_prompt[idx]["tau"],
            "layer_convention": "SpecForge/SGLang tap L = hs[L+1]",
        })
    taus = [f["tau_on_record"] for f in files]
    summary = {"prompts": TOY_PROMPTS, "block_size": block, "replay_max_new_tokens": max_new,
               "tau_on_record_macro": sum(taus) / len(taus),
               "records_equal_golden_causal_lm_rounds": all(
                   f["acceptance_lengths_on_record"] == f["golden_causal_lm_acceptance_lengths"] for f in files)}
    return files, summary


@torch.no_grad()
def tau_on_record(draft, model, rec, prompt_len: int, max_new: int) -> list[int]:
    """The reference of ``drafter --features``: the dflash 0.1.0 drafter replayed (GitHub-main rule: full
    blocks, record a+1, loop while start < prompt_len + max_new) on the record's own taps over the record's own
    tokens, drafting through the target's embeddings and LM head (bf16, as the toy pair's reference loop)."""
    seq = rec["input_ids"].tolist()
    feats = rec["hidden_states"][0]
    embed_w, lm_head = model.get_input_embeddings().weight, model.lm_head
    start, acc = prompt_len, []
    while start < prompt_len + max_new:
        drafts = torch.argmax(draft_logits_for(draft, embed_w, lm_head, feats, seq, start, torch.bfloat16),
                              dim=-1).tolist()
        a = 0
        while a < len(drafts) and drafts[a] == seq[start + 1 + a]:
            a += 1
        acc.append(a + 1)
        start += a + 1
    return acc


# ------------------------------------------------------------------------------------------------
# vLLM
# ------------------------------------------------------------------------------------------------
def write_vllm(model, prompts, n_layers, out: Path) -> list[dict]:
    files = []

    def one(folder, req_id, ids, captured, declared, layout):
        ref = reference(model, ids, n_layers)
        # aux id k = hs[k] for k < N; id N = the last layer's raw output (before the final norm)
        states = [ref.hs[k] if k < n_layers else ref.last for k in captured]
        hs = torch.stack(states, dim=1 if layout == "TLH" else 0)  # [T, L, H] or legacy [L, T, H]
        tensors = {"hidden_states": bf16(hs).detach().cpu(), "token_ids": torch.tensor(ids).detach().cpu()}
        path = out / folder / f"{req_id}.safetensors"
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(path))  # exactly the connector's call: no metadata
        found = identified(
            (f"hidden_states[{':, ' if layout == 'TLH' else ''}{j}] (declared id {k})",
             ref.identify(tensors["hidden_states"][:, j] if layout == "TLH" else tensors["hidden_states"][j], len(ids)))
            for j, k in enumerate(declared))
        files.append({
            "path": rel(path), "format": "vllm", "engine": "vLLM extract_hidden_states (ExampleHiddenStatesConnector)",
            "container": "safetensors", "keys": {k: tensor_info(v) for k, v in tensors.items()},
            "layout": "[T, L, H]" if layout == "TLH" else "[L, T, H] (older connector)",
            "prompt": int(req_id), "tokens": len(ids), "trailing_padding": 0,
            "eagle_aux_hidden_state_layer_ids": declared, "captured_layer_ids": captured,
            **found,
            "layer_convention": "vLLM aux id k = hs[k] (0 = embeddings); id N = last layer output before the final norm",
        })

    for i, ids in enumerate(prompts):
        one("vllm", str(i), ids, VLLM_IDS, VLLM_IDS, "TLH")
    one("vllm-legacy-layout", "0", prompts[0], VLLM_IDS, VLLM_IDS, "LTH")
    one("vllm-misindexed", "0", prompts[0], VLLM_BUGGY, VLLM_DECLARED, "TLH")
    files[-1]["deliberate_bug"] = ("blanket +1: configured with ids %s, captured %s; reading the declared ids "
                                   "maps every state one index too early (diff --align reports +1)"
                                   % (VLLM_DECLARED, VLLM_BUGGY))
    return files


# ------------------------------------------------------------------------------------------------
# SGLang
# ------------------------------------------------------------------------------------------------
def sglang_static_meta(rank: int) -> dict:
    return {
        "world_rank": rank,
        "world_size": SGLANG_TP,
        "sglang_parallel_info": {"tp_rank": rank, "tp_size": SGLANG_TP, "pp_rank": 0, "pp_size": 1,
                                 "moe_ep_rank": 0, "moe_ep_size": 1, "moe_tp_rank": rank, "moe_tp_size": SGLANG_TP},
    }


def write_sglang_dump(model, ids, n_layers, out: Path) -> list[dict]:
    new = greedy(model, ids, DUMP_NEW_TOKENS, n_layers)
    fed = ids + new[:-1]  # the last sampled token is never fed
    T = len(ids)
    ref = served(model, fed, T, n_layers)
    steps = [(0, list(range(0, T)))] + [(s, [T + s - 1]) for s in range(1, DUMP_NEW_TOKENS)]
    root = out / "sglang-dump" / SGLANG_EXP
    files = []
    for rank in range(SGLANG_TP):
        dump_index = 0
        for step, rows in steps:
            items = [
                ("input_ids", torch.tensor([fed[r] for r in rows], dtype=torch.long), None, None),
                ("positions", torch.tensor(rows, dtype=torch.long), None, None),
                ("non_intrusive__model.embed_tokens.output", ref.hs[0][rows], None, 0),
            ]
            for L in SGLANG_LAYERS:
                items.append((f"non_intrusive__model.layers.{L}.input_layernorm.output.1", ref.hs[L][rows], L, L))
            items.append(("non_intrusive__model.norm.output.0", ref.hs[n_layers][rows], None, n_layers))
            items.append(("non_intrusive__model.norm.output.1", ref.last[rows], None, "last_layer_output"))
            for name, value, layer_id, _ in items:
                dump_index += 1
                tags = {"step": step, "rank": rank, "dump_index": dump_index, "name": name,
                        "recompute_status": "disabled"}
                if layer_id is not None:
                    tags["layer_id"] = layer_id
                value = value.clone() if not value.is_floating_point() else bf16(value)
                path = root / ("___".join(f"{k}={v}" for k, v in tags.items()) + ".pt")
                torch_save({"value": value, "meta": {**tags, **sglang_static_meta(rank)}}, path)
                entry = {"path": rel(path), "format": "sglang-dump", "engine": "SGLang dumper (non-intrusive, all)",
                         "container": "torch zip pickle", "keys": {"value": tensor_info(value), "meta": "dict"},
                         "step": step, "rank": rank, "name": name}
                if value.is_floating_point():
                    entry.update(identified([("value", ref.identify(value, rows))]))
                files.append(entry)
    return files, {"prompt_ids": ids, "fed_ids": fed, "sampled_ids": new}


def write_sglang_json(model, ids, n_layers, out: Path, tok: Tokenizer) -> list[dict]:
    new = greedy(model, ids, NEW_TOKENS, n_layers)
    fed = ids + new[:-1]
    ref = served(model, fed, len(ids), n_layers)
    final = bf16(ref.hs[n_layers])
    rows = [final[: len(ids)].tolist()] + [final[len(ids) + j].tolist() for j in range(NEW_TOKENS - 1)]
    request = {"input_ids": ids, "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0},
               "return_hidden_states": True}
    response = {
        "text": tok.decode(new),
        "output_ids": new,
        "meta_info": {
            "id": "0b6d7c1e2f3a4b5c8d9e0f1a2b3c4d5e",
            "finish_reason": {"type": "length", "length": NEW_TOKENS},
            "prompt_tokens": len(ids),
            "completion_tokens": NEW_TOKENS,
            "cached_tokens": 0,
            "hidden_states": rows,
        },
    }
    d = out / "sglang-json"
    d.mkdir(parents=True, exist_ok=True)
    (d / "request.json").write_text(json.dumps(request) + "\n")
    (d / "response.json").write_text(json.dumps(response) + "\n")
    # what the JSON floats are: identify them like the binary files
    back = torch.tensor([*rows[0], *rows[1:]], dtype=torch.float32)
    return [{
        "path": rel(d / "response.json"), "format": "sglang-json",
        "engine": "SGLang /generate with return_hidden_states", "container": "JSON",
        "request": rel(d / "request.json"), "prompt": 0, "prompt_tokens": len(ids),
        "output_ids": new, "rows": len(fed), "input_ids": fed,
        **identified([("meta_info.hidden_states", ref.identify(back, len(fed)))]),
        "layer_convention": "the tensor fed to the LM head: final-normed hs[N] (one row per fed token)",
    }]


# ------------------------------------------------------------------------------------------------
# Malformed records (for the one-line refusals): written by the same torch.save, 4 tokens each
# ------------------------------------------------------------------------------------------------
def write_bad(prompts, H, out: Path) -> list[dict]:
    ids = torch.tensor(prompts[0][:4], dtype=torch.long)
    mask = torch.tensor([0, 0, 1, 1], dtype=torch.long)
    k = len(DFLASH_TAPS)
    good = torch.linspace(-1, 1, 4 * k * H).reshape(1, 4, k * H)
    cases = {
        "specforge-missing-hidden-states.ckpt": ({"input_ids": ids, "loss_mask": mask}, "no hidden_states key"),
        "specforge-bool-hidden-states.ckpt": (
            {"input_ids": ids, "loss_mask": mask, "hidden_states": good > 0}, "hidden_states is torch.bool"),
        "specforge-int32-hidden-states.ckpt": (
            {"input_ids": ids, "loss_mask": mask, "hidden_states": (good * 100).to(torch.int32)},
            "hidden_states is torch.int32"),
        "specforge-indivisible.ckpt": (
            {"input_ids": ids, "loss_mask": mask, "hidden_states": bf16(torch.linspace(-1, 1, 4 * (k * H + 1))
                                                                          .reshape(1, 4, k * H + 1))},
            f"last dim {k * H + 1} does not divide by {k} target_layer_ids"),
        "specforge-rows-mismatch.ckpt": (
            {"input_ids": ids, "loss_mask": mask, "hidden_states": bf16(good[:, :3])},
            "hidden_states has 3 rows, input_ids 4"),
    }
    files = []
    for name, (obj, why) in cases.items():
        path = out / "bad" / name
        torch_save(obj, path)
        files.append({"path": rel(path), "format": "specforge", "malformed": why,
                      "keys": {k2: tensor_info(v) for k2, v in obj.items()}})
    return files


# ------------------------------------------------------------------------------------------------
def main():
    os.chdir(REPO)
    if transformers.__version__ != EXPECTED_TRANSFORMERS:
        sys.exit(f"need transformers {EXPECTED_TRANSFORMERS}, have {transformers.__version__}")
    transformers.logging.set_verbosity_error()
    setup_determinism()
    out = REPO / OUT_REL
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)

    tiny = REPO / TINY
    tok = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    prompts = [tok.encode(json.loads(line)["text"], add_special_tokens=False).ids
               for line in (tiny / "prompts.jsonl").read_text().splitlines() if line.strip()]
    model, _, _ = load(AutoModelForCausalLM, TINY, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    n_layers, H = model.config.num_hidden_layers, model.config.hidden_size

    # the transformers run must be the one the goldens hold (bitwise): then "equals the golden within
    # one bf16 rounding" in the Rust tests is a statement about the engine file, not about this run
    from safetensors.torch import load_file
    gold = load_file(str(tiny / "golden" / "causal-lm.safetensors"))
    for k, ids in enumerate(prompts):
        r = reference(model, ids, n_layers)
        assert gold[f"p{k}.input_ids"].tolist() == ids
        assert all(torch.equal(r.hs[i], gold[f"p{k}.hidden_states.{i}"]) for i in range(n_layers + 1))
        assert torch.equal(r.last, gold[f"p{k}.last_layer_output"])

    files = []
    files += write_specforge(model, prompts, n_layers, H, out)
    files += write_vllm(model, prompts, n_layers, out)
    dump_files, dump_ids = write_sglang_dump(model, prompts[0], n_layers, out)
    files += dump_files
    files += write_sglang_json(model, prompts[0], n_layers, out, tok)
    toy_files, toy_summary = write_toy_specforge(out)
    files += toy_files
    files += write_bad(prompts, H, out)

    for f in files:
        p = REPO / f["path"]
        f["bytes"] = p.stat().st_size
        f["sha256"] = hashlib.sha256(p.read_bytes()).hexdigest()
    manifest = {
        "format": "hsparity engine-captures manifest v1",
        "generator": "tools/make_engine_captures.py",
        "tools": {"transformers": transformers.__version__, "torch": torch.__version__.split("+")[0]},
        "index_convention": "stored_layers values are transformers hidden_states indices (0 = embeddings, "
                            "l+1 = output of decoder layer l, N = final-normed) or 'last_layer_output' (the raw "
                            "last layer output, before the final norm; no hidden_states index); each was found "
                            "as the nearest of every transformers state of the same tokens (see identification_rule)",
        "identification_rule": "nearest transformers state by max |stored - bf16(state)| in bf16 ulps of the "
                               "row's scale (the bf16 spacing at the row's largest |state|); bound: 0 (bitwise) "
                               "where the engine ran the unpadded sequence, 1 where it ran a right-padded batch "
                               "(the padded forward differs from the unpadded one by f32 round-off, absolute at "
                               "about 2^-21 of the row's scale, before the bf16 rounding); margin: the runner-up "
                               f"is at least {MARGIN_REL_L2} away in relative L2 while the nearest is below 2^-8. "
                               "Per stored layer, identification records bitwise, max_bf16_ulps, rel_l2 and the "
                               "runner-up",
        "tiny": {"checkpoint": TINY, "num_layers": n_layers, "hidden_size": H, "loading_path": "causal-lm",
                 "compute_dtype": "float32, stored as bfloat16", "prompts": [len(p) for p in prompts],
                 "golden": TINY + "/golden/causal-lm.safetensors"},
        "specforge": {"target_layer_ids": DFLASH_TAPS, "eagle3_aux_hidden_states_layers": EAGLE3_AUX,
                      "batch_padded_to": max(len(p) for p in prompts)},
        "vllm": {"eagle_aux_hidden_state_layer_ids": VLLM_IDS, "misindexed_declared": VLLM_DECLARED,
                 "misindexed_captured": VLLM_BUGGY},
        "sglang_dump": {"dir": f"{OUT_REL}/sglang-dump/{SGLANG_EXP}", "tp_size": SGLANG_TP,
                        "max_new_tokens": DUMP_NEW_TOKENS, **dump_ids,
                        "env": {"DUMPER_ENABLE": "1", "DUMPER_DIR": "<dir>", "DUMPER_EXP_NAME": SGLANG_EXP,
                                "DUMPER_NON_INTRUSIVE_MODE": "all"}},
        "toy_pair": {"target": TOY + "/target", "drafter": TOY + "/drafter",
                     "records": OUT_REL + "/toy-pair-specforge", **toy_summary},
        "files": files,
    }
    write_json(out / "manifest.json", manifest)
    total = sum(f["bytes"] for f in files) + (out / "manifest.json").stat().st_size
    log(f"{len(files)} files, {total} bytes ({total / 1024:.0f} KiB) under {OUT_REL}")
    for f in files:
        log(f"  {f['path']}  {f['bytes']}  {f.get('stored_layers', '')}")


if __name__ == "__main__":
    main()
