"""Shared helpers of the benchmark scripts (standard library only)."""

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "target" / "release" / "hsparity"
WORK = ROOT / "target" / "bench"


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
