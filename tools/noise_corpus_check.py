#!/usr/bin/env python3
"""Check hsparity's measured noise floor against transformers on the corpus of
``tools/noise_corpus.py``: for every entry, ``hsparity dump`` (which measures the floor) and
``hsparity diff`` against transformers' own dump of the same path, then the rates.

    python3 tools/noise_corpus_check.py CORPUS_DIR [--hsparity target/release/hsparity]

Entries are named ``{family}-s{seed}-{dtype}`` (``tools/noise_corpus.py``; ``tools/moe_corpus.py``,
whose families are the expert layouts). Prints, per family and dtype and over all: the hidden
states compared, how many are bitwise, how many of the others lie inside the band (numerics
noise; f32 runs measure no band), the median and largest ratio of a difference to its band, how
many diffs pass, and how many pass when the dump measures no floor (``--no-noise-floor``: the
dtype's tolerance alone); then, where the dumps hold router choices (MoE), the token × slot
choices compared, how many differ, the tokens given another expert set, the noise shadow's
flips and the MoE layers whose flips lie within the floor (half precision), and the runs with
any flip; then every row outside its band. Needs only the Python standard library.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path


def diff_of(hs: str, corpus_entry: Path, tmp: Path, dtype: str, floor: bool) -> dict:
    """hsparity's dump of the entry in ``dtype`` (with or without its noise floor) diffed against
    transformers'."""
    ours = tmp / f"{corpus_entry.name}-{floor}.safetensors"
    subprocess.run([hs, "dump", str(corpus_entry / "checkpoint"), "--path", "causal-lm", "--dtype", dtype,
                    "--prompts", str(corpus_entry / "prompts.jsonl"), "--no-logits",
                    "--out", str(ours), "--force", "-q"] + ([] if floor else ["--no-noise-floor"]), check=True)
    out = subprocess.run([hs, "diff", str(ours), str(corpus_entry / "transformers.safetensors"),
                          "--json", "--no-report"], capture_output=True, text=True)
    if out.returncode not in (0, 1):
        sys.exit(f"{corpus_entry}: hsparity diff exited {out.returncode}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus", type=Path)
    ap.add_argument("--hsparity", default="target/release/hsparity")
    a = ap.parse_args()
    entries = sorted(p for p in a.corpus.iterdir() if (p / "transformers.safetensors").exists())
    if not entries:
        sys.exit(f"{a.corpus}: no corpus entries (write them with tools/noise_corpus.py)")
    tally = defaultdict(lambda: {"rows": 0, "bitwise": 0, "inside": 0, "max_ratio": 0.0, "ratios": [],
                                 "runs": 0, "pass": 0, "pass_without": 0})
    routers = defaultdict(lambda: {"slots": 0, "differing": 0, "tokens": 0, "runs": 0, "runs_flipping": 0,
                                   "first": defaultdict(int), "layers": 0, "within": 0, "shadow": 0})
    outside = []
    with tempfile.TemporaryDirectory() as tmp:
        for e in entries:
            family, _, dtype = e.name.rsplit("-", 2)
            half = dtype != "f32"
            d = diff_of(a.hsparity, e, Path(tmp), dtype, True)
            without = diff_of(a.hsparity, e, Path(tmp), dtype, False) if half else d
            keys = ((family, dtype), ("all", dtype))
            for key in keys:
                tally[key]["runs"] += 1
                tally[key]["pass"] += d["verdict"] == "pass"
                tally[key]["pass_without"] += without["verdict"] == "pass"
            rows = d["pairs"][0]["hidden_states"]
            for r in rows:
                cell = r.get("noise")
                if cell is not None and cell["ratio"] is None:  # the shadow bitwise there: any difference is outside
                    cell = {**cell, "ratio": float("inf")}
                if cell is None and half:
                    sys.exit(f"{e}: hidden_states[{r['index']}] has no noise band (was the floor measured?)")
                for key in keys:
                    t = tally[key]
                    t["rows"] += 1
                    t["bitwise"] += r["bitwise"]
                    if cell is not None:
                        t["inside"] += (not r["bitwise"]) and cell["inside"]
                        t["max_ratio"] = max(t["max_ratio"], cell["ratio"])
                        if not r["bitwise"]:
                            t["ratios"].append(cell["ratio"])
                if cell is not None and not r["bitwise"] and not cell["inside"]:
                    outside.append((e.name, r["index"], r["rel_l2"], r["cos_min"], cell))
            flips = [(r["index"] - 1, r["router"]) for r in rows if r.get("router")]
            first = next((layer for layer, c in flips if c["slots_differing"]), None)
            for key in keys if flips else ():
                t = routers[key]
                t["runs"] += 1
                t["slots"] += sum(c["slots"] for _, c in flips)
                t["differing"] += sum(c["slots_differing"] for _, c in flips)
                t["tokens"] += sum(c["tokens_with_other_experts"] for _, c in flips)
                t["runs_flipping"] += first is not None
                read = [c for _, c in flips if "within_noise_floor" in c]
                t["layers"] += len(read)
                t["within"] += sum(c["within_noise_floor"] for c in read)
                t["shadow"] += sum(c["noise_slots_differing"] for c in read)
                if first is not None:
                    t["first"][first] += 1
            print(f"checked {e.name}", file=sys.stderr, flush=True)
    last = lambda kv: (kv[0][0] == "all", kv[0])  # noqa: E731  (the totals last)
    print(f"{'family':14} {'dtype':5} {'states':>6} {'bitwise':>7} {'inside':>7} {'rate':>6} {'median':>6} "
          f"{'max':>6}  {'runs passing':>12} {'without floor':>13}")
    for (family, dtype), t in sorted(tally.items(), key=last):
        differ = t["rows"] - t["bitwise"]
        rate = (t["bitwise"] + t["inside"]) / t["rows"]
        median = statistics.median(t["ratios"]) if t["ratios"] else 0.0
        band = dtype != "f32"
        print(f"{family:14} {dtype:5} {t['rows']:6d} {t['bitwise']:7d} "
              + (f"{t['inside']:3d}/{differ:<3d} {rate:6.3f} {median:6.2f} {t['max_ratio']:6.2f}  " if band
                 else f"{'-':>7} {'-':>6} {'-':>6} {'-':>6}  ")
              + f"{t['pass']:5d} of {t['runs']:<3d} "
              + (f"{t['pass_without']:6d} of {t['runs']:<3d}" if band else f"{'-':>13}"))
    if routers:
        print(f"\n{'family':14} {'dtype':5} {'router choices':>14} {'differing':>9} {'agreement':>9} "
              f"{'other sets':>10} {'shadow flips':>12} {'layers within floor':>19} {'runs flipping':>13}  "
              "first flip at layer")
        for (family, dtype), t in sorted(routers.items(), key=last):
            first = ", ".join(f"{layer}: {n}" for layer, n in sorted(t["first"].items())) or "-"
            print(f"{family:14} {dtype:5} {t['slots']:14d} {t['differing']:9d} "
                  f"{1 - t['differing'] / t['slots']:9.5f} {t['tokens']:10d} "
                  + (f"{t['shadow']:12d} {t['within']:10d} of {t['layers']:<5d} " if t["layers"]
                     else f"{'-':>12} {'-':>19} ")
                  + f"{t['runs_flipping']:5d} of "
                  f"{t['runs']:<5d}  {first}")
    for name, i, rel, cos, cell in outside:
        b = cell["band"]
        print(f"outside: {name} hs {i}: rel L2 {rel:.3e} (band {b['rel_l2']:.3e}), cos min {cos:.8f} "
              f"(band {b['cos_min']:.8f}), ratio {cell['ratio']:.2f}")


if __name__ == "__main__":
    main()
