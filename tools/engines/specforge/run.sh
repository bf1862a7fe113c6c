#!/usr/bin/env bash
# Run SpecForge 0.2.0's offline hidden-state preparation on CPU (see ../README.md).
# Usage: run.sh TARGET_DIR DRAFTER_DIR DATA_JSONL OUT_DIR [extra prepare_hidden_states.py flags]
# Needs: target/specforge-venv under the repository root (pip install specforge==0.2.0), and next to this file
# scripts/prepare_hidden_states.py from sgl-project/SpecForge (not in the wheel) plus
# scripts/prepare_hidden_states_cpu.py = that file with prepare_hidden_states_cpu.diff applied.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
target=$1 drafter=$2 data=$3 out=$4; shift 4
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
export SF_CPU_PATCH=1                # W2, W3: cpu_patch.py
export SGLANG_USE_CPU_ENGINE=1       # W4
export SF_SCRIPT=prepare_hidden_states_cpu.py   # W6
cd "$here"
"$root/target/specforge-venv/bin/torchrun" --standalone --nproc_per_node=1 run_prepare.py \
  --target-model-path "$target" \
  --strategy dflash --draft-model-config "$drafter/config.json" \
  --data-path "$data" --chat-template toy --max-length 128 \
  --output-path "$out" --cache-dir "$root/target/specforge-run/cache" \
  --tp-size 1 --batch-size 1 --num-workers 0 --build-dataset-num-proc 1 --num-io-threads 1 \
  --sglang-attention-backend torch_native "$@"
