#!/usr/bin/env bash
# Issue 15's real-scale bar on the Qwen3.6-27B shape (dummy weights, simulated acceptance), one
# part per device call (needs_h200: on an H100 the servers' GDN state caps differ from C = 4,
# session 29):
#   source .gpu-kit/setup.sh && OUT=$OUT PART=fused-spec bash e2e/h200_bar15.sh
# PART:
#   fused-spec  adaptive DDTREE {7, 13, 31} (traced at C = 16) and NEXTN, the kit's norms as one
#               launch each (fused-norms, e2e/kit_norms.py);
#   fused-base  AR and DFLASH, fused norms;
#   torch-spec  adaptive DDTREE and NEXTN with the kit's torch norms (session 31's servers, beside
#               the AR and DFLASH records of session 21).
# A fused part first checks the one-launch norms against the kit's own stand-in
# (python -m benchmarks.kit_norms) and exits 1 before any server when they disagree.
# The compile caches are restored from .compile-cache/ (carry it) and saved to $OUT (copy the file
# there for the next call: a cold 27B start took 204 s in session 34, warm ones 60-81 s).
# Every part applies the patches, installs the plugin, runs REPEATS (3) repeats a level at C = LEVELS
# (1,2,4,8,16,32; e.g. LEVELS=8,16 REPEATS=5 to settle two levels) with
# SGLang's default memory settings, under LIMIT_S seconds (480: session 31's two servers took
# 262 s with a compile cache, the first start on a fresh machine about 150 s) for the harness.
# Afterwards, on the CPU:
#   python -m e2e.scale_report benchmarks/results/scale_h200.json <OUT>/<PART>
#   python -m e2e.scale_bar benchmarks/results/scale_h200.json --norms fused|torch \
#       --adaptive adaptive_budget_qwen3.6-27b_7-13-31_wy
set -uo pipefail
OUT=${OUT:-/tmp/h200_bar15}
PART=${PART:-}
PY=${SGLANG_KIT_PYTHON:?source .gpu-kit/setup.sh first}
LIMIT_S=${LIMIT_S:-480}
ADAPTIVE="qwen3.6-27b:ddtree:adaptive=benchmarks/results/adaptive_budget_qwen3.6-27b_7-13-31_wy.json"
ADAPTIVE+=":acc=7@3.17/13@3.51/31@4.01:tree-temp=1e-8"
case "$PART" in
  fused-spec) servers=("$ADAPTIVE:fused-norms:profile=16" "qwen3.6-27b:nextn:acc=3.1:fused-norms") ;;
  fused-base) servers=("qwen3.6-27b:ar:fused-norms" "qwen3.6-27b:dflash:acc=3:fused-norms") ;;
  torch-spec) servers=("$ADAPTIVE:profile=16" "qwen3.6-27b:nextn:acc=3.1") ;;
  *) echo "PART=${PART}: valid: fused-spec, fused-base, torch-spec" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
bash e2e/compile_cache.sh restore
if [[ $PART == fused-* ]]; then
  "$PY" -m benchmarks.kit_norms --json "$OUT/kit_norms.json" >"$OUT/kit_norms.md" 2>&1
  status=$?
  cat "$OUT/kit_norms.md"
  [ $status -eq 0 ] || { echo "the one-launch norms failed their check: no server started" >&2; exit 1; }
fi
"$PY" -c 'from e2e import kit; print(kit.apply_patches()); print(kit.install_plugin())' \
  >"$OUT/setup.log" 2>&1 || { cat "$OUT/setup.log"; exit 1; }
timeout "$LIMIT_S" "$PY" -m e2e.scale --out "$OUT/$PART" --time-budget $((LIMIT_S - 15)) \
  --start-estimate 150 --repeats "${REPEATS:-3}" --levels "${LEVELS:-1,2,4,8,16,32}" \
  --server-arg mem-fraction-static= --server-arg max-running-requests= \
  --servers "${servers[@]}" >"$OUT/$PART.log" 2>&1
rc=$?
echo "e2e.scale rc $rc" | tee -a "$OUT/$PART.log"
grep -E '^\||healthy in|failed|skipping' "$OUT/$PART.log" | tail -n 40
bash e2e/compile_cache.sh save "$OUT"
exit $rc
