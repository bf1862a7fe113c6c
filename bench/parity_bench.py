#!/usr/bin/env python3
"""Benchmark: `hsparity compare` vs the equivalent transformers script
(bench/py_parity.py), same machine, same prompts (token ids), eager attention,
same thread count; both measured end to end under /usr/bin/time -v, in one run.

    python3 bench/parity_bench.py [tiny|mid|mid-bf16|mid-2k|mid-long|mid-bf16-long|mid-bf16-8k|
                                   mid-divergent|all]
                                  [--python .venv/bin/python] [--repeat 3] [--tool compare|dump]

tiny: fixtures/tiny-qwen3_5, f32 on both sides. The mid cases are random ~264 M-parameter
Qwen3.5 checkpoints written by tools/make_mid_checkpoint.py under target/bench/ (once):

  mid            f32 on disk, both sides in f32 (`--dtype f32`, `dtype=torch.float32`);
  mid-bf16       bf16 on disk, identical paths, both sides in the checkpoint's dtype
                 (`compare` default `--dtype auto`, transformers `dtype="auto"`);
  mid-2k, mid-long  the mid checkpoint, f32, one prompt of 2048 / 4096 tokens (long eval
                 contexts; its max_position_embeddings is 4096);
  mid-bf16-long  the mid-bf16 checkpoint, one prompt of 4096 tokens in bf16;
  mid-bf16-8k    the same weights with max_position_embeddings 8192, one prompt of 8192
                 tokens in bf16;
  mid-divergent  fp16 on disk, `text_config.dtype = bfloat16` and no top-level dtype:
                 AutoModelForCausalLM resolves bf16, AutoModel f16 (both sides `auto`).

`--tool dump` measures `hsparity dump --path causal-lm` (one path's hidden states and
logits to a safetensors file, the noise shadow in bf16/f16 as by default) against
`py_parity.py --dump` (AutoModelForCausalLM alone, the same tensors saved with
safetensors) instead of `compare` against the two-class script.

Prints median wall time and peak RSS of each side, the ratios, and a roofline line:
the matmul FLOPs (the linear layers and the LM head, 2 x parameters x tokens per
forward) of the forwards each tool runs divided by its wall time, against the f32 and
bf16 GEMM peaks of torch.matmul on the layers' shapes, measured in the same run.
Goals: compare >= 2x faster on every mid case, >= 3x on the identical-path
cases (mid, mid-bf16); peak RSS <= 0.3x transformers'.
"""

import argparse
import json
import os
import subprocess

from common import machine, BIN, ROOT, WORK, build, gib, median_run, read_headers

INCREMENTAL_STEPS = 8  # hsparity::parity::incremental::STEPS

CASES = {
    # name: (checkpoint, make_mid_checkpoint.py flags (None: a fixture), dtype, prompts, tokens,
    #        identical paths)
    "tiny": (ROOT / "fixtures" / "tiny-qwen3_5", None, "f32", 4, 32, True),
    "mid": (WORK / "mid-qwen3_5", [], "f32", 4, 128, True),
    "mid-bf16": (WORK / "mid-bf16-qwen3_5", ["--dtype", "bfloat16"], "auto", 4, 128, True),
    "mid-2k": (WORK / "mid-qwen3_5", [], "f32", 1, 2048, True),
    "mid-long": (WORK / "mid-qwen3_5", [], "f32", 1, 4096, True),
    "mid-bf16-long": (WORK / "mid-bf16-qwen3_5", ["--dtype", "bfloat16"], "auto", 1, 4096, True),
    "mid-bf16-8k": (
        WORK / "mid-bf16-8k-qwen3_5",
        ["--dtype", "bfloat16", "--max-positions", "8192"],
        "auto", 1, 8192, True,
    ),
    "mid-divergent": (
        WORK / "mid-divergent-qwen3_5",
        ["--dtype", "float16", "--text-dtype", "bfloat16"],
        "auto", 4, 128, False,
    ),
}

GEMM_BENCH = r"""
import json, sys, time, torch
threads, shapes = int(sys.argv[1]), json.loads(sys.argv[2])
torch.set_num_threads(threads)
out = {}
for name, dt in (("f32", torch.float32), ("bf16", torch.bfloat16)):
    best = 0.0
    for m, k, n in shapes:
        a, b = torch.randn(m, k, dtype=dt), torch.randn(n, k, dtype=dt)
        with torch.inference_mode():
            for _ in range(3):
                torch.matmul(a, b.t())
            reps, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < 1.0:
                torch.matmul(a, b.t())
                reps += 1
            dt_s = (time.perf_counter() - t0) / reps
        best = max(best, 2 * m * k * n / dt_s)
    out[name] = best
print(json.dumps(out))
"""


def header(ckpt):
    """Tensor name -> shape over every safetensors shard of `ckpt`."""
    return {k: v["shape"] for _, _, h in read_headers(ckpt) for k, v in h.items()}


def linear_params(ckpt):
    """(parameters of the text model's 2-D matmul weights without the LM head, the LM
    head's, the distinct [out, in] shapes): what a forward multiplies by."""
    layers, head, dims = 0, 0, set()
    for k, s in header(ckpt).items():
        if len(s) != 2 or "visual" in k or "embed_tokens" in k or not k.endswith(".weight"):
            continue
        if "lm_head" in k:
            head += s[0] * s[1]
        else:
            layers += s[0] * s[1]
            dims.add(tuple(s))
    return layers, head, sorted(dims)


def roofline(ckpt, n, t, identical, wall_py, wall_hs, peaks):
    layers, head, _ = linear_params(ckpt)
    tokens = n * t
    fwd = 2 * (layers + head) * tokens  # one forward of every prompt
    py_flops = 2 * fwd  # two models, one forward each
    # hsparity: identical paths run one forward; diverging paths run path a, path b and
    # b's layers on a's inputs (the local comparison; the LM head on two inputs). The
    # prefill-vs-incremental check takes its prefill from the capture's forward and runs
    # 8 single steps once per distinct dtype.
    if identical:
        hs_flops, checks = fwd, 1
    else:
        hs_flops, checks = 3 * 2 * layers * tokens + 2 * 2 * head * tokens, 2
    hs_flops += checks * 2 * layers * INCREMENTAL_STEPS
    f32, bf16 = peaks["f32"], peaks["bf16"]
    for who, fl, w in (("transformers", py_flops, wall_py), ("hsparity", hs_flops, wall_hs)):
        g = fl / w / 1e9
        print(f"  roofline {who:12} {fl / 1e9:7.1f} GFLOP in {w:6.2f} s = {g:6.1f} GFLOP/s"
              f"  ({100 * g * 1e9 / f32:5.1f}% of f32 peak {f32 / 1e9:.0f}, "
              f"{100 * g * 1e9 / bf16:5.1f}% of bf16 peak {bf16 / 1e9:.0f} GFLOP/s)")


def gemm_peaks(py, ckpt, t, threads):
    _, _, dims = linear_params(ckpt)
    big = sorted(dims, key=lambda d: -d[0] * d[1])[:3]  # the MLP's and the widest projections
    shapes = [[4 * t, k, m] for m, k in big]
    out = subprocess.run([py, "-c", GEMM_BENCH, str(threads), json.dumps(shapes)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def run_case(name, py, repeat, tool="compare"):
    ckpt, make, dtype, n, t, identical = CASES[name]
    if make is not None and not (ckpt / "config.json").exists():
        subprocess.run([py, ROOT / "tools" / "make_mid_checkpoint.py", ckpt, *make], check=True)
    vocab = json.loads((ckpt / "config.json").read_text()).get("text_config", {}).get("vocab_size", 384)
    prompts = [[(17 + 7919 * (k * t + i)) % vocab for i in range(t)] for k in range(n)]
    ids_file = WORK / f"{name}-ids.json"
    ids_file.write_text(json.dumps(prompts))
    threads = os.cpu_count()
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), RAYON_NUM_THREADS=str(threads))
    py_dtype = "float32" if dtype == "f32" else "auto"
    py_cmd = [py, ROOT / "bench" / "py_parity.py", ckpt, "--ids-file", ids_file, "--threads", threads,
              "--dtype", py_dtype]
    if tool == "dump":
        py_cmd += ["--dump", WORK / "py-dump.safetensors"]
        hs_cmd = [BIN, "dump", ckpt, "--path", "causal-lm", "--dtype", dtype, "--force", "--quiet",
                  "--out", WORK / "hs-dump.safetensors"]
    else:
        hs_cmd = [BIN, "compare", ckpt, "--paths", "causal-lm,vlm", "--dtype", dtype, "--no-report",
                  "--quiet"]
    for p in prompts:
        hs_cmd += ["--prompt-ids", ",".join(map(str, p))]
    load0 = os.getloadavg()[0]
    hw, hr, _, rc = median_run(hs_cmd, repeat, env)
    pw, pr, pout, _ = median_run(py_cmd, repeat, env)
    print(f"[{name}] {ckpt.name}: {n} prompts x {t} tokens, {threads} threads, median of {repeat}, "
          f"load average {load0:.2f} before / {os.getloadavg()[0]:.2f} after")
    what = "py_parity.py --dump" if tool == "dump" else "py_parity.py"
    print(f"  transformers ({what}, dtype={py_dtype}): wall {pw:7.2f} s   peak RSS {gib(pr)}")
    print(f"  hsparity {tool} --dtype {dtype} (exit {rc}):  wall {hw:7.2f} s   peak RSS {gib(hr)}")
    print(f"  speed-up {pw / hw:6.2f}x   peak-RSS ratio (hsparity/transformers) {hr / pr:.2f}")
    last = [l for l in pout.splitlines() if l.startswith("hidden_states")][-1:]
    if tool == "compare":
        print(f"  transformers' own last row: {last[0] if last else '?'}")
    if make is not None and tool == "compare":
        roofline(ckpt, n, t, identical, pw, hw, gemm_peaks(py, ckpt, t, threads))
    return name, pw, pr, hw, hr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case", nargs="?", default="all", choices=["all", *CASES])
    ap.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"),
                    help="Python with tools/requirements.txt installed (default: the repo's .venv)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tool", default="compare", choices=["compare", "dump"],
                    help="hsparity compare against py_parity.py, or hsparity dump against its --dump")
    a = ap.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    build()
    print("\n".join(machine(a.python)))
    rows = [run_case(c, a.python, a.repeat, a.tool) for c in (list(CASES) if a.case == "all" else [a.case])]
    print(f"\n{'case':14} {'transformers':>22} {'hsparity':>22} {'speed-up':>9} {'RSS ratio':>9}")
    for name, pw, pr, hw, hr in rows:
        print(f"{name:14} {pw:9.2f} s {gib(pr):>10} {hw:9.2f} s {gib(hr):>10} {pw / hw:8.2f}x {hr / pr:9.2f}")


if __name__ == "__main__":
    main()
