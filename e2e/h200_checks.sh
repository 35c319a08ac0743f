#!/usr/bin/env bash
# Everything a plugin / tree / GDN change must still pass on the lent H200, in one call (~8 min).
# Run from the repo root with the GPU kit carried (.gpu-kit is git-ignored):
#   source .gpu-kit/setup.sh && OUT=$OUT bash e2e/h200_checks.sh
#  1. the Triton kernels compiled for the GPU against the torch paths: the tree core (including its
#     own tie breaking, which the CPU interpreter cannot check) and the tree GDN recurrence
#     (system python3: torch + Triton; pytest), and the harness's one-launch norms (e2e/kit_norms.py);
#     the interpreter tests are CI's, see e2e/h200_verify_change.sh;
#  2. the tiny hybrid pair on real SGLang with CUDA graphs (decode batches up to 16): AR, DFLASH,
#     DDTREE(64) (override with SERVERS=...), greedy output = AR sequentially and concurrently,
#     tokens per verify step (python -m e2e.tiny_pair; judge any difference on the CPU with
#     python -m e2e.compare_reference <OUT>/e2e/e2e.json --pair hybrid);
#  3. afterwards, alone on the GPU: our tree GDN recurrence against SGLang's per-node-snapshot tree
#     verify at the Qwen3.6-27B layer shape (benchmarks/gdn_tree_recurrence.py: checks + cost table).
set -uo pipefail
OUT=${OUT:-/tmp/h200_checks}
mkdir -p "$OUT"
F=$PWD/sglang_spec/fixtures/tiny-pair
export PYTHONUNBUFFERED=1
(python3 -m pytest -q -p no:cacheprovider tests/test_triton_kernels.py tests/test_gdn_tree_recurrence.py \
  tests/test_gdn_tree_conv.py tests/test_kit_norms.py -k "not interpreter" >"$OUT/gpu_kernel_tests.log" 2>&1; echo "pytest rc $?" >>"$OUT/gpu_kernel_tests.log") &
timeout "${E2E_LIMIT_S:-330}" "$SGLANG_KIT_PYTHON" -m e2e.tiny_pair --out "$OUT/e2e" --target "$F/hybrid" \
  --drafter "$F/hybrid-dflash" --prompts "$F/heldout_prompts.jsonl" \
  --servers "${SERVERS:-ar+graphs,dflash+graphs,ddtree64+graphs}" --graph-bs 16 >"$OUT/e2e.log" 2>&1
echo "e2e.tiny_pair rc $?" | tee -a "$OUT/e2e.log"
wait
tail -n 3 "$OUT/gpu_kernel_tests.log"
timeout "${GDN_LIMIT_S:-200}" "$SGLANG_KIT_PYTHON" benchmarks/gdn_tree_recurrence.py \
  --json "$OUT/gdn_tree_recurrence.json" >"$OUT/gdn_tree_recurrence.md" 2>&1
echo "gdn_tree_recurrence rc $?" | tee -a "$OUT/gdn_tree_recurrence.md"
tar czf "$OUT/e2e_run.tgz" -C "$OUT" e2e 2>/dev/null
rm -rf "$OUT/e2e"
tail -n 45 "$OUT/e2e.log"
cat "$OUT/gdn_tree_recurrence.md" | tail -n 40
