#!/usr/bin/env bash
# Run on the lent H200 from the repo root: retrain the DFlash drafters of the bundled tiny pair on the
# *shipped* targets (tokenizer, hybrid + MTP, qwen3 stay as they are), several drafter variants at once
# (each its own process; the tiny models leave the GPU mostly idle, so they share it well), each with
# the same time box. Every variant ends with the trainer's reload checks. Results: $OUT/drafters.tgz
# (one folder per variant: hybrid-dflash/ or qwen3-dflash/, train_config.json, train.log) and the logs.
# Pick the winner on the CPU with `python -m benchmarks.acceptance --drafter-dir ...`.
#   usage: bash benchmarks/h200_train_drafters.sh BOX_SECONDS "NAME:STAGE:PATH=JSON;PATH=JSON..." ...
set -uo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
box=$1; shift
fix=sglang_spec/fixtures/tiny-pair
work=/tmp/drafters
rm -rf "$work" && mkdir -p "$work"
pids=()
for spec in "$@"; do
  IFS=: read -r name stage sets <<<"$spec"
  d="$work/$name" && mkdir -p "$d"
  cp -r "$fix/tokenizer" "$fix/train_config.json" "$d/"
  kind=${stage%-dflash}
  cp -r "$fix/$kind" "$d/"
  args=(--out "$d" --stage "$stage" --set "train.$stage.box=$box")
  IFS=";" read -ra extra <<<"$sets"
  for s in "${extra[@]}"; do [ -n "$s" ] && args+=(--set "$s"); done
  echo "== $name: python -m training ${args[*]}"
  python3 -m training "${args[@]}" >"$d/train.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
for spec in "$@"; do
  name=${spec%%:*}
  echo "== $name"; grep -E "final eval|WARNING|Error|error" "$work/$name/train.log" | tail -4
  rm -rf "$work/$name/tokenizer" "$work/$name/hybrid" "$work/$name/qwen3"
done
tar -C "$work" -czf "${OUT:-/tmp}/drafters.tgz" .
exit $rc
