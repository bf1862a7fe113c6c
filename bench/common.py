"""Shared helpers of the benchmark scripts (standard library only)."""

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "target" / "release" / "hsparity"
WORK = ROOT / "target" / "bench"


TORCH_FACTS = r"""
import json, torch
cfg = torch.__config__.show()
print(json.dumps({
    "torch": torch.__version__,
    "threads": torch.get_num_threads(),
    "mkldnn (oneDNN)": torch.backends.mkldnn.is_available(),
    "mkl": torch.backends.mkl.is_available(),
    "cpu capability": torch.backends.cpu.get_cpu_capability(),
    "build": [l.strip(" -") for l in cfg.splitlines()
              if any(k in l for k in ("MKL-DNN", "oneDNN", "Math Kernel Library")) and "Build settings" not in l],
}))
"""


def machine(py=None):
    """The machine every figure of a run belongs to, as printed lines: CPU model, the ISA
    flags the kernels depend on (AVX-512F, AVX512-BF16, AMX), cores, memory, and torch's
    CPU paths (oneDNN/MKL, its dispatch capability) when `py` has torch."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name")), "?")
    flags = set(next((l.split(":", 1)[1].split() for l in info.splitlines() if l.startswith("flags")), []))
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_fp16") if f in flags]
    mem = next((l.split()[1] for l in Path("/proc/meminfo").read_text().splitlines()
                if l.startswith("MemTotal")), "0") if Path("/proc/meminfo").exists() else "0"
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lines = [f"machine: {model}; {usable} logical CPUs usable; {int(mem) / 2**20:.0f} GiB; "
             f"ISA {' '.join(isa) or 'none of avx2/avx512f/avx512_bf16/amx'}"]
    if py:
        out = subprocess.run([py, "-c", TORCH_FACTS], capture_output=True, text=True)
        if out.returncode == 0:
            t = json.loads(out.stdout)
            lines.append(f"torch {t['torch']}: {t['threads']} threads, oneDNN {t['mkldnn (oneDNN)']}, "
                         f"MKL {t['mkl']}, CPU capability {t['cpu capability']}")
            lines += [f"  {b}" for b in t["build"]]
    kernels = subprocess.run([str(BIN), "compare", "fixtures/tiny-qwen3_5", "--no-report", "--quiet", "--json"],
                             capture_output=True, text=True, cwd=ROOT)
    try:
        k = json.loads(kernels.stdout)["environment"]["kernels"]
        lines.append(f"hsparity kernels: CPU features {k['cpu_features']}, ran on the tiny fixture {k['ran']}, "
                     f"disabled by {k['disabled_by'] or 'nothing'}")
    except (ValueError, KeyError):
        lines.append("hsparity kernels: unknown (compare --json did not run)")
    return lines


def build():
    subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)


def timed(cmd, env=None):
    """Runs `cmd` under /usr/bin/time -v; returns (wall_s, peak_rss_bytes, stdout, rc)."""
    p = subprocess.run(
        ["/usr/bin/time", "-v", *map(str, cmd)], capture_output=True, text=True, env=env, cwd=ROOT
    )
    err = p.stderr
    m = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)", err)
    wall = (int(m.group(1) or 0) * 3600 + int(m.group(2)) * 60 + float(m.group(3))) if m else float("nan")
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", err)
    rss = int(m.group(1)) * 1024 if m else -1
    if p.returncode not in (0, 1):
        sys.stderr.write(err[-4000:])
        raise SystemExit(f"command failed ({p.returncode}): {' '.join(map(str, cmd))}")
    return wall, rss, p.stdout, p.returncode


def median_run(cmd, repeat, env=None):
    runs = [timed(cmd, env) for _ in range(repeat)]
    wall = statistics.median(r[0] for r in runs)
    rss = statistics.median(r[1] for r in runs)
    return wall, rss, runs[-1][2], runs[-1][3]


def read_headers(ckpt: Path):
    """[(shard file, header length, header dict without __metadata__)] of every shard."""
    out = []
    for f in sorted(ckpt.glob("*.safetensors")):
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        header.pop("__metadata__", None)
        out.append((f, n, header))
    return out


def gib(b):
    return f"{b / 2**30:.2f} GiB"


def write_sparse_checkpoint(out: Path, config: dict, tensors: list, n_shards: int):
    """Sparse safetensors shards with the given headers (no data written)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    width = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8}
    per = -(-len(tensors) // n_shards)
    weight_map, total = {}, 0
    for i in range(0, len(tensors), per):
        chunk = tensors[i : i + per]
        name = f"model-{i // per + 1:05d}-of-{n_shards:05d}.safetensors"
        header, off = {}, 0
        for t in chunk:
            n = width[t["dtype"]]
            for d in t["shape"]:
                n *= d
            header[t["name"]] = {"dtype": t["dtype"], "shape": t["shape"], "data_offsets": [off, off + n]}
            off += n
            weight_map[t["name"]] = name
        header["__metadata__"] = {"format": "pt"}
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % 8)
        with open(out / name, "wb") as f:
            f.write(len(h).to_bytes(8, "little"))
            f.write(h)
            f.truncate(8 + len(h) + off)
        total += off
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    )
    return total
