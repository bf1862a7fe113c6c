#!/usr/bin/env python3
"""The transformers side of bench/drafter_bench.py: z-lab's DFlash loop on one prompt.

    python drafter_loop.py TARGET DRAFTER IDS.json MAX_NEW THREADS

Loads TARGET with AutoModelForCausalLM (dtype "auto", eager attention) and DRAFTER with
dflash 0.1.0's DFlashDraftModel in bf16, runs `dflash.model.dflash_generate` greedily
(temperature 0, no stop tokens) and prints one JSON line: τ (the mean acceptance length over
the rounds), the rounds and the tokens generated. Needs transformers 5.23.0, torch, dflash 0.1.0.
"""

import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM

import dflash.model as dm
from dflash.model import DFlashDraftModel

target_dir, drafter_dir, ids_file, max_new, threads = sys.argv[1:6]
torch.set_num_threads(int(threads))
dm._cuda_time = time.perf_counter  # the wheel times with CUDA events; this is a CPU run
ids = json.loads(open(ids_file).read())
with torch.inference_mode():
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype="auto", attn_implementation="eager").eval()
    drafter = DFlashDraftModel.from_pretrained(drafter_dir, dtype=torch.bfloat16).eval()
    r = dm.dflash_generate(drafter, target, torch.tensor(ids)[None], max_new_tokens=int(max_new),
                           stop_token_ids=None, temperature=0.0, return_stats=True)
acc = [int(a) for a in r.acceptance_lengths]
print(json.dumps({"tau": sum(acc) / len(acc), "rounds": len(acc),
                  "new_tokens": int(r.output_ids.shape[1]) - len(ids)}))
