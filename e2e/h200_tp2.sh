#!/usr/bin/env bash
# TP = 2 on the two-GPU H200 machine (issue 12 item 5), one device call of kind nvidia-h200-x2:
#   source .gpu-kit/setup.sh && OUT=$OUT bash e2e/h200_tp2.sh
# 1. the trained tiny Qwen3 pair (the hybrid's single GDN key head cannot be split in two) with
#    --tp-size 2 and CUDA graphs: AR, DFLASH and DDTREE(63) greedy outputs, sequential and
#    concurrent (python -m e2e.tiny_pair; DDTREE's draft top-K takes the vocabulary-parallel path,
#    a local top-K per rank, an all-gather and a merge);
# 2. the Qwen3.6-27B shape with dummy weights at TP = 2 (python -m e2e.scale): DDTREE(15),
#    DFLASH, DDTREE(63) and AR at C = LEVELS (default 1,8), patch series applied (DDTREE's GDN
#    tree ReplaySSM), until the call's time runs out (--time-budget skips what does not fit);
#    levels benchmarks/results/scale_h200.json already has are skipped (--resume), so repeated
#    calls add up (session 8: DDTREE(15) in 137 s of start, then out of time).
# The compile caches are restored from .compile-cache/ (carry it) and saved to $OUT.
# SGLang's custom all-reduce needs sgl_kernel's CUDA ops, which the kit stands in for with torch:
# every server runs --disable-custom-all-reduce (NCCL all-reduce). The machine keeps NVLink
# multicast off (NCCL_NVLS_ENABLE=0): SGLang sets that variable to 0 unless --enable-nccl-nvls.
# Afterwards, on the CPU, judge any greedy difference at fp32 (python -m e2e.compare_reference
# <OUT>/tiny/e2e.json --pair qwen3) and merge the records (python -m e2e.scale_report).
set -uo pipefail
OUT=${OUT:-/tmp/h200_tp2}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${SGLANG_KIT_PYTHON:?source .gpu-kit/setup.sh first}
F=$PWD/sglang_spec/fixtures/tiny-pair
gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
[ "$gpus" -ge 2 ] || { echo "TP = 2 needs 2 GPUs; this machine has $gpus" >&2; exit 2; }
bash e2e/compile_cache.sh restore
rc=0
timeout "${TINY_LIMIT_S:-300}" "$PY" -m e2e.tiny_pair --out "$OUT/tiny" --target "$F/qwen3" \
  --drafter "$F/qwen3-dflash" --prompts "$F/heldout_prompts.jsonl" \
  --servers ar+graphs,ddtree63+graphs,dflash+graphs --graph-bs 8 --samples 8 \
  --server-arg tp-size=2 --server-arg disable-custom-all-reduce >"$OUT/tiny.log" 2>&1
status=$?
echo "tiny TP=2 rc $status" | tee -a "$OUT/tiny.log"
[ $status -eq 0 ] || rc=1
tail -n 20 "$OUT/tiny.log"
"$PY" -c 'from e2e import kit; print(kit.apply_patches())' >"$OUT/patch.log" 2>&1 ||
  { echo "patch apply failed"; cat "$OUT/patch.log"; exit 1; }
"$PY" -m e2e.scale --out "$OUT/scale" --levels "${LEVELS:-1,8}" --repeats 1 --graph-bs 8 \
  --time-budget "${SCALE_BUDGET_S:-240}" --resume benchmarks/results/scale_h200.json \
  --server-arg mem-fraction-static= --server-arg max-running-requests= \
  --server-arg disable-custom-all-reduce \
  --servers qwen3.6-27b:ddtree:b=15:tp=2 qwen3.6-27b:dflash:tp=2 qwen3.6-27b:ddtree:b=63:tp=2 \
  qwen3.6-27b:ar:tp=2 >"$OUT/scale.log" 2>&1
status=$?
echo "scale TP=2 rc $status" | tee -a "$OUT/scale.log"
[ $status -eq 0 ] || rc=1
grep -E '^\|' "$OUT/scale.log" | tail -n 20
bash e2e/compile_cache.sh save "$OUT"
exit $rc
