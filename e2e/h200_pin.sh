#!/usr/bin/env bash
# DDTREE on the second SGLang pin, on the lent H200 (issue 16, item 3). Run from the repo root with
# a GPU kit built for the pin and carried along (.gpu-kit is git-ignored):
#   CPU side:  SGLANG_VERSION=0.5.22 bash ../shared/sglang-gpu-kit/prepare.sh
#   device:    source .gpu-kit/setup.sh && bash e2e/h200_pin.sh
# 1. checks that the kit serves the pin (SGLANG_PIN, default 0.5.22) and applies the pin's kit edits
#    (e2e/gpu_kit_pin_edits.py: flashinfer imports 0.5.22 makes at module level);
# 2. serves the trained tiny hybrid pair (Qwen3.5 Gated-DeltaNet target, DFlash drafter, block 16),
#    every server with CUDA graphs for decode batches up to 4 (python -m e2e.tiny_pair):
#      ar+graphs                the reference outputs,
#      ddtree16+graphs          verify width 17 >= block / 2: runs on the unpatched pin,
#      ddtree4+graphs+patched   width 5 < block / 2: only after `sglang-spec patch apply` (P3);
#    and prints gpu_e2e's table: greedy = AR (sequential and concurrent), tokens per verify step.
# Afterwards, on the CPU, judge any greedy difference against the float32 reference engine:
#   python -m e2e.compare_reference <OUT>/e2e/e2e.json --pair hybrid
# Servers size their KV pool from free GPU memory at start, so nothing else runs beside them.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source .gpu-kit/setup.sh >"$OUT/kit.log" 2>&1
PY=$SGLANG_KIT_PYTHON
pin=${SGLANG_PIN:-0.5.22}
have=$("$PY" -c 'import sglang; print(sglang.__version__)' 2>>"$OUT/kit.log")
if [ "$have" != "$pin" ]; then
  echo "the kit serves sglang '$have', not $pin: build it with SGLANG_VERSION=$pin prepare.sh" >&2
  exit 2
fi
"$PY" e2e/gpu_kit_pin_edits.py /tmp/gpukit/site || exit 1
F=$PWD/sglang_spec/fixtures/tiny-pair
timeout "${E2E_LIMIT_S:-540}" "$PY" -m e2e.tiny_pair --out "$OUT/e2e" --target "$F/hybrid" \
  --drafter "$F/hybrid-dflash" --prompts "$F/heldout_prompts.jsonl" \
  --servers ar+graphs,ddtree16+graphs,ddtree4+graphs+patched --graph-bs 4 --samples 4 \
  --start-timeout 240 >"$OUT/e2e.log" 2>&1
echo "gpu_e2e rc $?"
tail -n 40 "$OUT/e2e.log"
