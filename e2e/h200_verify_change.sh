#!/usr/bin/env bash
# A change to the GDN tree verify (its kernels, patches 0002/0003) on the lent H200, in one call
# (~8 min). From the repo root with the kit and the compile cache carried:
#   source .gpu-kit/setup.sh && OUT=$OUT bash e2e/h200_verify_change.sh
#  1. in the background: the GDN Triton kernels compiled for the GPU against their torch forms
#     (system python3; pytest: tree conv, tree recurrence; not the interpreter tests, which CI
#     runs: the device's Triton 3.6 interpreter cannot take range() over a scalar argument with
#     numpy 2, the walk kernel of before session 13 included);
#  2. the tiny hybrid pair on real SGLang, patched, with the tree ReplaySSM and CUDA graphs: greedy
#     output of AR and DDTREE(64) (TINY_SERVERS overrides), sequential and concurrent, and tokens
#     per step (python -m e2e.tiny_pair; judge any difference on the CPU with
#     python -m e2e.compare_reference <run>/e2e/e2e.json --pair hybrid; E2E_LIMIT_S=0 leaves
#     it out);
#  3. the 27B shape at stated tau (python -m e2e.scale; SCALE_SERVERS overrides): DDTREE(63) at
#     tau 4.23 with a kernel trace at C = 1, DDTREE(15) at tau 3 with stage times; SCALE_ARGS adds
#     e2e.scale options, e.g. --start-estimate 90 --levels 1,8).
# Results in $OUT: gpu_kernel_tests.log, e2e.log, scale.log and runs.tar.xz (e2e/ and scale/).
set -uo pipefail
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
F=$PWD/sglang_spec/fixtures/tiny-pair
RUNS=$(mktemp -d)
export PYTHONUNBUFFERED=1
bash e2e/compile_cache.sh restore
"$SGLANG_KIT_PYTHON" -c 'from e2e import kit; kit.apply_patches(); kit.install_plugin()'
(python3 -m pytest -q -p no:cacheprovider tests/test_gdn_tree_conv.py tests/test_gdn_tree_recurrence.py \
  -k "not interpreter" >"$OUT/gpu_kernel_tests.log" 2>&1; echo "pytest rc $?" >>"$OUT/gpu_kernel_tests.log") &
E2E_S=${E2E_LIMIT_S:-200}
if [ "$E2E_S" != 0 ]; then  # E2E_LIMIT_S=0: no tiny pair (a call of 27B servers only)
  timeout "$E2E_S" "$SGLANG_KIT_PYTHON" -m e2e.tiny_pair --out "$RUNS/e2e" \
    --target "$F/hybrid" --drafter "$F/hybrid-dflash" --prompts "$F/heldout_prompts.jsonl" \
    --servers "${TINY_SERVERS:-ar+graphs,ddtree64+graphs+patched+replayssm}" --graph-bs 16 \
    >"$OUT/e2e.log" 2>&1
  echo "e2e.tiny_pair rc $?" | tee -a "$OUT/e2e.log"
fi
SCALE_S=${SCALE_LIMIT_S:-300}
# shellcheck disable=SC2086  # SCALE_SERVERS is a list of server specs
timeout "$SCALE_S" "$SGLANG_KIT_PYTHON" -m e2e.scale --out "$RUNS/scale" \
  --time-budget $((SCALE_S - 10)) --levels 1,2,4,8,16,32 \
  --server-arg mem-fraction-static= --server-arg max-running-requests= \
  --servers ${SCALE_SERVERS:-qwen3.6-27b:ddtree:b=63:acc=4.23:profile=1 qwen3.6-27b:ddtree:b=15:acc=3:stages} ${SCALE_ARGS:-} \
  >"$OUT/scale.log" 2>&1
echo "e2e.scale rc $?" | tee -a "$OUT/scale.log"
wait
tar cJf "$OUT/runs.tar.xz" -C "$RUNS" .
tail -n 3 "$OUT/gpu_kernel_tests.log"
[ "$E2E_S" = 0 ] || tail -n 25 "$OUT/e2e.log"
tail -n 45 "$OUT/scale.log"
