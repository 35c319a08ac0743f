#!/usr/bin/env bash
# Run on the lent H200 from the repo root (GPU kit in .gpu-kit), for the patches issue:
#   1. SGLang 0.5.23's GDN tree-verify Triton kernels compiled for the GPU against sglang_spec.gdn
#      (tests/test_sglang_gdn_kernels.py with SGLANG_SPEC_KERNEL_DEVICE=cuda; the N = 257 case is left
#      out: Triton needs ~17 min to compile the conv kernel unrolled over N = 257; it runs on the CPU)
#      and, side by side (both mostly compile on the CPU), python -m benchmarks.gdn_verify (tree vs chain cost);
#   2. then DDTREE budget 4 served by a *patched* SGLang (`sglang-spec patch apply` on the kit's copy;
#      unpatched 0.5.23 cannot reserve KV for a verify width 5 < block 16 / 2 and the plug-in refuses
#      it), greedy texts compared with the AR server recorded in BASELINE (an e2e.json of an earlier run
#      with the same target and prompts).
# Servers size their KV pool from free GPU memory at start, so nothing else runs beside the server.
#   usage: bash benchmarks/h200_gdn_patched.sh BASELINE_E2E_JSON
set -uo pipefail
baseline=$1
OUT=${OUT:-/tmp/out}
source .gpu-kit/setup.sh >"$OUT/kit.log" 2>&1
PY=$SGLANG_KIT_PYTHON
F=$PWD/sglang_spec/fixtures/tiny-pair
t=${GDN_LIMIT_S:-180}
( PYTHONPATH="$PWD:$PYTHONPATH" SGLANG_SPEC_KERNEL_DEVICE=cuda timeout "$t" "$PY" -m pytest -q -p no:cacheprovider \
    tests/test_sglang_gdn_kernels.py -k "not ddtree_b256"; echo "pytest rc $?" ) >"$OUT/gdn_test.log" 2>&1 &
( timeout "$t" "$PY" -m benchmarks.gdn_verify --widths 17 65; echo "gdn_verify rc $?" ) \
  >"$OUT/gdn_verify.md" 2>&1 &
wait
timeout "${E2E_LIMIT_S:-170}" "$PY" -m e2e.tiny_pair --out /tmp/e2e --target "$F/hybrid" --drafter "$F/hybrid-dflash" \
  --prompts "$F/heldout_prompts.jsonl" --servers ddtree4+patched --baseline "$baseline" --start-timeout 150 \
  >"$OUT/e2e.log" 2>&1
cp /tmp/e2e/e2e.json "$OUT/e2e_patched.json" 2>/dev/null
tail -n 25 "$OUT/gdn_test.log" "$OUT/gdn_verify.md" "$OUT/e2e.log"
