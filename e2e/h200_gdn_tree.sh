#!/usr/bin/env bash
# GDN tree ReplaySSM (issue 14: patches 0002 + 0003, --enable-linear-replayssm-spec) on the lent
# H200. Run from the repo root with the GPU kit carried:
#   source .gpu-kit/setup.sh && OUT=$OUT bash e2e/h200_gdn_tree.sh            # kind nvidia-h200-x2
#   source .gpu-kit/setup.sh && PARTS=tiny OUT=$OUT bash e2e/h200_gdn_tree.sh # one part per call
#   source .gpu-kit/setup.sh && PARTS=variants OUT=$OUT bash e2e/h200_gdn_tree.sh
# With both parts and two GPUs, the parts run side by side, the tiny pair on GPU 0 (port 30000),
# the 27B shape on GPU 1 (port 30010); with one GPU, one after the other (more than one call).
#  1. `sglang-spec patch apply` on the kit's SGLang (the series: 0001, 0002, 0003) and the plug-in
#     installed once (e2e.kit.install_plugin), before either part starts;
#  2. tiny: the tiny hybrid pair, DDTREE(64) with the flag, eager and with CUDA graphs for decode
#     batches up to GRAPH_BS (default 4), larger batches eager (SERVERS): greedy texts = AR (the
#     session-3 AR run as baseline; 16 prompts) sequentially and 16 concurrently, tokens per verify
#     step; DIST_SAMPLES (default 1000) 2-token samples at T = 1 from the graphs server for the
#     chi-square against the target's exact float32 law (on the CPU: python -m e2e.sampling_check
#     <OUT>/e2e/e2e.json --target sglang_spec/fixtures/tiny-pair/hybrid); then no slots lost
#     (issue 14 item 5, e2e/slots.py): 64 concurrent streams of 128 tokens, 16 aborted mid-stream,
#     the KV and mamba pools' free counts (/metrics) equal before and after, no error in the log.
#     Judge any greedy difference on the CPU in fp32: python -m e2e.compare_reference
#     <OUT>/e2e/e2e.json --pair hybrid;
#  3. variants (only when named in PARTS): the tiny part's greedy and slots checks, graphs server
#     only, with `--mamba-radix-cache-strategy no_buffer` (the tiny and 27B configs resolve to
#     extra_buffer; SGLang allows no_buffer only with `--disable-overlap-schedule`) and
#     `--chunked-prefill-size 96` (8 of the 16 prompts, 99-175 tokens, prefilled in chunks);
#  4. scale: the Qwen3.6-27B shape (dummy weights) at SGLang's default memory settings, DDTREE(63)
#     with the flag (its server config turns it on) and DFLASH in the same run: max_running_requests
#     (scale.json, `mamba_cache_log`) and ms/step at C = LEVELS (default 1..32), graphs up to bs 8.
# The compile caches are saved to <OUT>/compile-cache.tar.xz for the next call (e2e/compile_cache.sh).
# Exit status: 1 if a part failed (or the patches did not apply), else 0.
set -uo pipefail
OUT=${OUT:-/tmp/h200_gdn_tree}
mkdir -p "$OUT"
F=$PWD/sglang_spec/fixtures/tiny-pair
export PYTHONUNBUFFERED=1
PY=${SGLANG_KIT_PYTHON:?source .gpu-kit/setup.sh first}
bash e2e/compile_cache.sh restore
"$PY" -c 'from e2e import kit; print(kit.apply_patches()); print(kit.install_plugin())' \
  >"$OUT/patch_apply.log" 2>&1 || { cat "$OUT/patch_apply.log"; exit 1; }
PARTS=${PARTS:-tiny scale}
gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count())')

tiny_run() {  # NAME LIMIT ARGS...: the tiny hybrid pair's checks into $OUT/NAME, log $OUT/NAME.log
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$PY" -m e2e.tiny_pair --out "$OUT/$name" --port 30000 \
    --target "$F/hybrid" --drafter "$F/hybrid-dflash" --prompts "$F/heldout_prompts.jsonl" \
    --num-prompts 16 --graph-bs "${GRAPH_BS:-4}" \
    --baseline benchmarks/results/e2e_h200/session3/ar_dflash_graphs16.json "$@" \
    >"$OUT/$name.log" 2>&1
  local status=$?
  echo "$name: e2e.tiny_pair rc $status" | tee -a "$OUT/$name.log"
  return $status
}

tiny() {
  tiny_run e2e "${E2E_LIMIT_S:-500}" --samples 8 --abort-check "${ABORT_CHECK:-64}" \
    --servers "${SERVERS:-ddtree64+graphs+patched+replayssm,ddtree64+patched+replayssm}" \
    --dist-samples "${DIST_SAMPLES:-1000}" --dist-servers ddtree64+graphs+patched+replayssm
}

variants() {
  tiny_run variants "${VARIANTS_LIMIT_S:-300}" --samples 4 --abort-check 64 \
    --servers ddtree64+graphs+patched+replayssm \
    --server-arg mamba-radix-cache-strategy=no_buffer --server-arg chunked-prefill-size=96 \
    --server-arg disable-overlap-schedule
}

scale() {
  timeout "${SCALE_LIMIT_S:-520}" "$PY" -m e2e.scale --out "$OUT/scale" --port 30010 \
    --time-budget "${SCALE_BUDGET_S:-500}" --levels "${LEVELS:-1,2,4,8,16,32}" --graph-bs 8 \
    --server-arg mem-fraction-static= --server-arg max-running-requests= \
    --servers qwen3.6-27b:ddtree:b=63 qwen3.6-27b:dflash >"$OUT/scale.log" 2>&1
  local status=$?
  echo "e2e.scale rc $status" | tee -a "$OUT/scale.log"
  return $status
}

rc=0
if [[ " $PARTS " == *" tiny "* && " $PARTS " == *" scale "* && $gpus -ge 2 ]]; then
  CUDA_VISIBLE_DEVICES=0 tiny &
  tiny_pid=$!
  CUDA_VISIBLE_DEVICES=1 scale &
  scale_pid=$!
  wait $tiny_pid || rc=1
  wait $scale_pid || rc=1
else
  if [[ " $PARTS " == *" tiny "* ]]; then tiny || rc=1; fi
  if [[ " $PARTS " == *" scale "* ]]; then scale || rc=1; fi
fi
if [[ " $PARTS " == *" variants "* ]]; then variants || rc=1; fi
[ -f "$OUT/e2e.log" ] && tail -n 40 "$OUT/e2e.log"
[ -f "$OUT/variants.log" ] && tail -n 20 "$OUT/variants.log"
if [ -f "$OUT/scale.log" ]; then
  grep -E '^\|' "$OUT/scale.log" | tail -n 12
  grep -h "max_running_requests\|Mamba Cache is allocated\|ReplaySSM ring" "$OUT"/scale/logs/*.log 2>/dev/null | head -n 8
fi
bash e2e/compile_cache.sh save "$OUT"
runs=()
for d in e2e variants; do [ -d "$OUT/$d" ] && runs+=("$d"); done
[ ${#runs[@]} -gt 0 ] && tar czf "$OUT/e2e_run.tgz" -C "$OUT" "${runs[@]}"
exit $rc
