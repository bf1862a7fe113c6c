#!/usr/bin/env python3
"""Check hsparity's measured noise floor against transformers on the corpus of
``tools/noise_corpus.py``: for every entry, ``hsparity dump`` (which measures the floor) and
``hsparity diff`` against transformers' own dump of the same path, then the rates.

    python3 tools/noise_corpus_check.py CORPUS_DIR [--hsparity target/release/hsparity]

Prints, per family and dtype and over all: the hidden states compared, how many are bitwise,
how many of the others lie inside the band (numerics noise), the median and largest ratio of a
difference to its band, how many diffs pass, and how many pass when the dump measures no floor
(``--no-noise-floor``: the dtype's tolerance alone); then every row outside its band. Needs only the Python standard library.
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


def diff_of(hs: str, corpus_entry: Path, tmp: Path, floor: bool) -> dict:
    """hsparity's dump of the entry (with or without its noise floor) diffed against transformers'."""
    ours = tmp / f"{corpus_entry.name}-{floor}.safetensors"
    subprocess.run([hs, "dump", str(corpus_entry / "checkpoint"), "--path", "causal-lm",
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
    outside = []
    with tempfile.TemporaryDirectory() as tmp:
        for e in entries:
            family, _, dtype = e.name.split("-")
            d = diff_of(a.hsparity, e, Path(tmp), True)
            without = diff_of(a.hsparity, e, Path(tmp), False)
            for key in ((family, dtype), ("all", "all")):
                tally[key]["runs"] += 1
                tally[key]["pass"] += d["verdict"] == "pass"
                tally[key]["pass_without"] += without["verdict"] == "pass"
            for r in d["pairs"][0]["hidden_states"]:
                cell = r.get("noise")
                if cell is not None and cell["ratio"] is None:  # the shadow bitwise there: any difference is outside
                    cell = {**cell, "ratio": float("inf")}
                if cell is None:
                    sys.exit(f"{e}: hidden_states[{r['index']}] has no noise band (was the floor measured?)")
                for key in ((family, dtype), ("all", "all")):
                    t = tally[key]
                    t["rows"] += 1
                    t["bitwise"] += r["bitwise"]
                    t["inside"] += (not r["bitwise"]) and cell["inside"]
                    t["max_ratio"] = max(t["max_ratio"], cell["ratio"])
                    if not r["bitwise"]:
                        t["ratios"].append(cell["ratio"])
                if not r["bitwise"] and not cell["inside"]:
                    outside.append((e.name, r["index"], r["rel_l2"], r["cos_min"], cell))
            print(f"checked {e.name}", file=sys.stderr, flush=True)
    print(f"{'family':8} {'dtype':5} {'states':>6} {'bitwise':>7} {'inside':>7} {'rate':>6} {'median':>6} "
          f"{'max':>6}  {'runs passing':>12} {'without floor':>13}")
    for (family, dtype), t in sorted(tally.items(), key=lambda kv: kv[0] == ("all", "all")):
        differ = t["rows"] - t["bitwise"]
        rate = (t["bitwise"] + t["inside"]) / t["rows"]
        median = statistics.median(t["ratios"]) if t["ratios"] else 0.0
        print(f"{family:8} {dtype:5} {t['rows']:6d} {t['bitwise']:7d} {t['inside']:3d}/{differ:<3d} "
              f"{rate:6.3f} {median:6.2f} {t['max_ratio']:6.2f}  {t['pass']:5d} of {t['runs']:<3d} "
              f"{t['pass_without']:6d} of {t['runs']:<3d}")
    for name, i, rel, cos, cell in outside:
        b = cell["band"]
        print(f"outside: {name} hs {i}: rel L2 {rel:.3e} (band {b['rel_l2']:.3e}), cos min {cos:.8f} "
              f"(band {b['cos_min']:.8f}), ratio {cell['ratio']:.2f}")


if __name__ == "__main__":
    main()
