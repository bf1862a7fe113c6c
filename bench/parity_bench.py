#!/usr/bin/env python3
"""Benchmark: `hsparity compare` vs the equivalent transformers script
(bench/py_parity.py), same machine, same prompts (token ids), f32, eager
attention, same thread count; both measured end to end under /usr/bin/time -v.

    python3 bench/parity_bench.py [tiny|mid|all] [--python .venv/bin/python] [--repeat 3]

tiny: fixtures/tiny-qwen3_5. mid: a random ~264 M-parameter Qwen3.5 checkpoint
written by tools/make_mid_checkpoint.py into target/bench/mid-qwen3_5 (once).
Prints median wall time and peak RSS of each and the ratios.
Goals (issue 7): tiny >= 20x faster; mid >= 1.5x faster and <= 0.5x peak RSS.
"""

import argparse
import json
import os
import subprocess

from common import BIN, ROOT, WORK, build, gib, median_run

CASES = {
    # name: (checkpoint, vocab, prompts, tokens)
    "tiny": (ROOT / "fixtures" / "tiny-qwen3_5", 384, 4, 32),
    "mid": (WORK / "mid-qwen3_5", 32000, 4, 128),
}


def run_case(name, py, repeat):
    ckpt, vocab, n, t = CASES[name]
    if name == "mid" and not (ckpt / "config.json").exists():
        subprocess.run([py, ROOT / "tools" / "make_mid_checkpoint.py", ckpt], check=True)
    prompts = [[(17 + 7919 * (k * t + i)) % vocab for i in range(t)] for k in range(n)]
    ids_file = WORK / f"{name}-ids.json"
    ids_file.write_text(json.dumps(prompts))
    threads = os.cpu_count()
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), RAYON_NUM_THREADS=str(threads))
    py_cmd = [py, ROOT / "bench" / "py_parity.py", ckpt, "--ids-file", ids_file, "--threads", threads]
    hs_cmd = [BIN, "compare", ckpt, "--paths", "causal-lm,vlm", "--dtype", "f32", "--no-report", "--quiet"]
    for p in prompts:
        hs_cmd += ["--prompt-ids", ",".join(map(str, p))]
    hw, hr, _, rc = median_run(hs_cmd, repeat, env)
    pw, pr, pout, _ = median_run(py_cmd, repeat, env)
    print(f"[{name}] {ckpt.name}: {n} prompts x {t} tokens, {threads} threads, median of {repeat}")
    print(f"  transformers (py_parity.py): wall {pw:7.2f} s   peak RSS {gib(pr)}")
    print(f"  hsparity compare (exit {rc}):  wall {hw:7.2f} s   peak RSS {gib(hr)}")
    print(f"  speed-up {pw / hw:6.1f}x   peak-RSS ratio (hsparity/transformers) {hr / pr:.2f}")
    last = [l for l in pout.splitlines() if l.startswith("hidden_states")][-1:]
    print(f"  transformers' own last row: {last[0] if last else '?'}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case", nargs="?", default="all", choices=["tiny", "mid", "all"])
    ap.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"),
                    help="Python with tools/requirements.txt installed (default: the repo's .venv)")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    build()
    for c in (["tiny", "mid"] if a.case == "all" else [a.case]):
        run_case(c, a.python, a.repeat)


if __name__ == "__main__":
    main()
