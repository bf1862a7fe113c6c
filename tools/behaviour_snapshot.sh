#!/usr/bin/env bash
# Behaviour snapshot: runs every verb on the bundled fixtures and writes what it
# printed (JSON, terminal tables, report.md, exit codes, stderr of refused
# inputs) into OUT_DIR, with run-dependent values (wall times, peak RSS,
# thread counts, the kernels this CPU has and ran, the default memory budget (a share of the memory free at
# the time), temporary paths, time stamps) normalised.
#
# Use it around a refactor that must not change behaviour:
#
#   tools/behaviour_snapshot.sh target/snapshot-before   # on the old commit
#   tools/behaviour_snapshot.sh target/snapshot-after    # on the new one
#   diff -r target/snapshot-before target/snapshot-after # must print nothing
#
# Needs jq. Builds the release binary first. Takes about a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: tools/behaviour_snapshot.sh OUT_DIR}
rm -rf "$out"
mkdir -p "$out"
cargo build --release --quiet
bin=target/release/hsparity
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Run-dependent JSON members, set to fixed values.
norm_json='walk(if type == "object" then
    (if has("wall_s") then .wall_s = 0 else . end)
  | (if has("wall_time_s") then .wall_time_s = 0 else . end)
  | (if has("peak_rss_bytes") then .peak_rss_bytes = 0 else . end)
  | (if has("threads") then .threads = 0 else . end)
  | (if has("budget_bytes") then .budget_bytes = 0 else . end)
  | (if has("hsparity_version") and has("kernels") then del(.kernels) else . end)
  else . end)'
norm_text() {
  sed -E -e "s#$work#WORK#g" \
    -e 's/peak RSS [0-9.]+ GiB/peak RSS X GiB/g' \
    -e 's/\([0-9]+ threads\)/(N threads)/g' \
    -e 's/wall time [0-9.]+ s/wall time X s/g' \
    -e 's/budget [0-9.]+ GiB \(([0-9]+)% of the available memory \([0-9.]+ GiB\)\)/budget X GiB (\1% of the available memory (X GiB))/g' \
    -e 's/[0-9]{8}-[0-9]{6}(-[0-9]+)?/STAMP/g' \
    -e 's/% of the available memory \([0-9.]+ GiB\)/% of the available memory (X GiB)/g' \
    -e 's/┆ [0-9]+\.[0-9]{2}( +)┆/┆ S\1┆/g'
}

# run NAME ARGS...: stdout (JSON normalised when it parses), stderr, exit code.
run() {
  local name=$1
  shift
  local rc=0
  "$bin" "$@" >"$work/stdout" 2>"$work/stderr" || rc=$?
  echo "$rc" >"$out/$name.rc"
  if jq -e . "$work/stdout" >/dev/null 2>&1; then
    jq -S "$norm_json" "$work/stdout" | norm_text >"$out/$name.json"
  else
    norm_text <"$work/stdout" >"$out/$name.out"
  fi
  if [ -s "$work/stderr" ]; then norm_text <"$work/stderr" >"$out/$name.err"; fi
}

# report NAME ARGS...: as run, writing a report folder, whose files are kept.
report() {
  local name=$1
  shift
  rm -rf "$work/rep"
  run "$name" "$@" --report-dir "$work/rep" --name r
  if [ -d "$work/rep/r" ]; then
    for f in "$work"/rep/r/*; do
      case "$f" in
      *.json) jq -S "$norm_json" "$f" | norm_text >"$out/$name.report.json" ;;
      *.md) norm_text <"$f" >"$out/$name.report.md" ;;
      *.svg) norm_text <"$f" >"$out/$name.report.svg" ;;
      esac
    done
  fi
}

fx=fixtures
tiny=$fx/tiny-qwen3_5
toy=$fx/toy-pair
toyq=$fx/toy-pair-qwen3

# inventory
for c in $tiny $fx/tiny-qwen3 $fx/divergence/* $toy/target $toyq/target; do
  n=inventory-$(basename "$c")
  run "$n-json" inventory "$c" --json
  run "$n-table" inventory "$c"
done
run inventory-paths inventory $tiny --paths vlm,causal-lm --json

# compare
report compare-tiny-json compare $tiny --json --quiet
report compare-tiny-table compare $tiny --quiet
report compare-tiny-3paths compare $tiny --paths causal-lm,vlm,image-text-to-text --json --quiet
report compare-tiny-bf16 compare $tiny --dtype bf16 --taps 1,3 --json --quiet
report compare-tiny-recurrent compare $tiny --gdn-form recurrent --no-incremental --quiet
report compare-qwen3 compare $fx/tiny-qwen3 --json --quiet
report compare-qwen3-table compare $fx/tiny-qwen3 --quiet
for d in fp16-disk bf16-auto legacy-duplicated-prefix text-only-causal nested-prefix; do
  report "compare-$d" compare $fx/divergence/$d --json
  report "compare-$d-table" compare $fx/divergence/$d
done
report compare-tied compare $fx/divergence/tied-top-level --paths causal-lm,image-text-to-text --json --quiet
report compare-tied-table compare $fx/divergence/tied-top-level --paths causal-lm,image-text-to-text --quiet
report compare-toy-drafter compare $toy/target --drafter $toy/drafter --prompts $toy/prompts.jsonl --max-new-tokens 16 --json --quiet
report compare-toy-drafter-table compare $toy/target --drafter $toy/drafter --prompts $toy/prompts.jsonl --max-new-tokens 16 --quiet
report compare-ids compare $tiny --prompt-ids 1,2,3,4,5 --prompt "hello there" --json --quiet

# dump + diff
run dump-causal dump $tiny --path causal-lm --out "$work/a.safetensors" --quiet
run dump-vlm dump $tiny --path vlm --out "$work/b.safetensors" --quiet
run dump-bf16 dump $tiny --path causal-lm --dtype bf16 --out "$work/c.safetensors" --quiet --no-logits
run dump-fp16disk dump $fx/divergence/fp16-disk --path vlm --out "$work/d.safetensors" --quiet
run dump-fp16disk-c dump $fx/divergence/fp16-disk --path causal-lm --out "$work/e.safetensors" --quiet
report diff-ab diff "$work/a.safetensors" "$work/b.safetensors" --json
report diff-ab-table diff "$work/a.safetensors" "$work/b.safetensors"
report diff-ac diff "$work/a.safetensors" "$work/c.safetensors" --json
report diff-ac-table diff "$work/a.safetensors" "$work/c.safetensors"
report diff-offset diff "$work/a.safetensors" "$work/b.safetensors" --tap-offset 1 --json
run dump-golden-prompts dump $tiny --path causal-lm --prompts $tiny/prompts.jsonl --out "$work/g.safetensors" --quiet
run dump-golden-p0 dump $tiny --path causal-lm --prompt "The hidden state of the model." --out "$work/g0.safetensors" --quiet
report diff-golden diff $tiny/golden/causal-lm.safetensors "$work/g.safetensors" --json
report diff-golden-py diff $tiny/golden/vlm.safetensors $tiny/golden/py-dump-vlm.safetensors --json
report diff-de diff "$work/e.safetensors" "$work/d.safetensors" --json
report diff-de-table diff "$work/e.safetensors" "$work/d.safetensors"

# drafter
run drafter-toy drafter $toy/target --drafter $toy/drafter --prompts $toy/prompts.jsonl --max-new-tokens 16 --json --quiet
run drafter-toy-table drafter $toy/target --drafter $toy/drafter --prompts $toy/prompts.jsonl --max-new-tokens 16 --quiet
run drafter-toy-wheel drafter $toy/target --drafter $toy/drafter --max-new-tokens 9 --end-rule wheel --json --quiet
run drafter-toyq drafter $toyq/target --drafter $toyq/drafter --prompts $toyq/prompts.jsonl --max-new-tokens 16 --json --quiet
run drafter-toyq-bf16 drafter $toyq/target --drafter $toyq/drafter --max-new-tokens 8 --dtype f32 --json --quiet

# triage
report triage-toy triage $toy/target --drafter $toy/drafter --prompts $toy/prompts.jsonl --max-new-tokens 16 --json --quiet
report triage-toy-table triage $toy/target --drafter $toy/drafter --prompts $toy/prompts.jsonl --max-new-tokens 16 --observed-tau 3 --quiet
report triage-toyq triage $toyq/target --drafter $toyq/drafter --prompts $toyq/prompts.jsonl --max-new-tokens 16 --json --quiet
report triage-toy-chat triage $toy/target --drafter $toy/drafter --prompts $toy/prompts.jsonl --chat --enable-thinking true --max-new-tokens 16 --reset-at 6 --left-pad 3 --seed 7 --json --quiet
# triage on supplied trajectories (dflash_generate's outputs on the held-out prompts)
jq -c '.sets.held_out.per_prompt[] | {prompt_ids: .input_ids, output_ids: .output_ids}' \
  $toy/golden/reference_generate_gdn_crop.json >"$work/trajectories.jsonl"
report triage-toy-trajectories triage $toy/target --drafter $toy/drafter --trajectories "$work/trajectories.jsonl" --max-new-tokens 16 --json --quiet

# prompts and chat-templated prompts
run prompts-tiny prompts $tiny --json
run prompts-tiny-chat prompts $tiny --chat --prompt "What is the capital of France?" --json
run prompts-tiny-chat-table prompts $tiny --chat --prompt "What is the capital of France?" --enable-thinking false
run prompts-qwen3-set prompts $fx/tiny-qwen3 --prompt-set gsm8k:2 --system "Be brief." --json
run prompts-tiny-refused prompts $tiny --prompt-set humaneval:4
run drafter-toy-chat drafter $toy/target --drafter $toy/drafter --prompts $toy/prompts.jsonl --chat --enable-thinking true --max-new-tokens 16 --json --quiet
run drafter-toy-chat-table drafter $toy/target --drafter $toy/drafter --prompts $toy/prompts.jsonl --chat --enable-thinking false --max-new-tokens 16 --quiet
# engine captures: import, diff of a partial dump (--align), drafter --features
caps=$fx/engine-captures
run import-specforge import $caps/specforge-dflash --target-layer-ids 1,3 --num-layers 6 --out "$work/sf.safetensors" --json
run import-specforge-table import $caps/specforge-dflash --target-layer-ids 1,3 --num-layers 6
run import-vllm import $caps/vllm-misindexed --layer-ids 1,2,3,4 --num-layers 6 --out "$work/mis.safetensors" --json
run import-sglang import $caps/sglang-dump --num-layers 6 --json
report diff-partial diff $tiny/golden/causal-lm.safetensors "$work/sf.safetensors" --json
report diff-align diff "$work/g0.safetensors" "$work/mis.safetensors" --align --json
report diff-align-table diff "$work/g0.safetensors" "$work/mis.safetensors" --align
run drafter-features drafter $toy/target --drafter $toy/drafter --features $caps/toy-pair-specforge --max-new-tokens 16 --json --quiet
run drafter-features-table drafter $toy/target --drafter $toy/drafter --features $caps/toy-pair-specforge --max-new-tokens 16 --quiet
run bad-import import $caps/bad/specforge-int32-hidden-states.ckpt --target-layer-ids 1,3
run bad-import-format import $caps/vllm --format gguf
# the MoE family (qwen3_5_moe): inventories with the converted category, the
# router agreement of compare, drafter and triage with the random drafter
moe=$fx/moe
for c in $moe/qwen3.5-fused $moe/qwen3.6-fused $moe/per-expert $moe/divergence/fp16-disk; do
  n=inventory-moe-$(basename "$c")
  run "$n-json" inventory "$c" --json
  run "$n-table" inventory "$c"
done
report compare-moe-per-expert compare $moe/per-expert --paths causal-lm,vlm,image-text-to-text --json --quiet
report compare-moe-fp16-disk compare $moe/divergence/fp16-disk --prompts $moe/divergence/fp16-disk/prompts.jsonl --json --quiet
report compare-moe-fp16-disk-table compare $moe/divergence/fp16-disk --prompts $moe/divergence/fp16-disk/prompts.jsonl --quiet
run drafter-moe drafter $moe/qwen3.5-fused --drafter $moe/drafter-random --prompts $moe/qwen3.5-fused/prompts.jsonl --max-new-tokens 8 --json --quiet
report triage-moe triage $moe/qwen3.5-fused --drafter $moe/drafter-random --prompts $moe/qwen3.5-fused/prompts.jsonl --max-new-tokens 8 --json --quiet

# refused inputs (exit 2, one line)
run bad-paths compare $tiny --paths causal-lm,nope --no-report
run bad-dtype compare $tiny --dtype f64 --no-report
run bad-dump-path dump $tiny --path nope --out "$work/x.safetensors"
run bad-dump-dtype dump $tiny --path vlm --dtype q8 --out "$work/x.safetensors"
run bad-tap compare $tiny --taps 99 --no-report
run bad-diff diff $tiny/config.json "$work/a.safetensors" --no-report
run bad-inventory-paths inventory $tiny --paths causal-lm,causal-lm
run bad-drafter-paths drafter $toy/target --drafter $toy/drafter --paths vlm,zz
run bad-max-tau drafter $toy/target --drafter $toy/drafter --max-tau-gap=-1
run bad-prompt-set prompts $tiny --prompt-set nope
run bad-prompt-set-0 compare $tiny --prompt-set gsm8k:0 --no-report
run bad-chat-no-template prompts $fx/divergence/fp16-disk --chat
run bad-thinking-without-chat drafter $toy/target --drafter $toy/drafter --enable-thinking true
run bad-reset-at triage $toy/target --drafter $toy/drafter --prompts $toy/prompts.jsonl --reset-at 99 --no-report
echo "snapshot: $(ls "$out" | wc -l) files in $out"
