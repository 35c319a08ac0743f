#!/usr/bin/env bash
# Run on the lent H200 from the repo root (GPU kit in .gpu-kit). One tools/gpu_e2e.py run on the tiny
# hybrid pair, servers one after the other:
#   nextn+graphs     NEXTN (MTP head, steps 3, topk 1, 4 tokens; CUDA graphs up to bs 32) + the load-test
#                    sweep C = 1..32 (the sweeps of AR / DFLASH / DDTREE(64) came from an earlier call)
#   ddtree4+patched  DDTREE budget 4 after `sglang-spec patch apply` on the kit's SGLang: unpatched 0.5.23
#                    cannot reserve KV for a verify width 5 < block 16 / 2 (the plug-in refuses it);
#                    greedy texts are compared with the AR server recorded in BASELINE (an e2e.json of an
#                    earlier run, same target and prompts)
# Beside the NEXTN server's start-up, holding the lock that gpu_e2e takes before sending requests (so no
# timing overlaps): tests/test_sglang_gdn_kernels.py on the GPU (SGLANG_SPEC_KERNEL_DEVICE=cuda), then
# benchmarks/gdn_verify.py. Everything lands in $OUT.
#   usage: bash benchmarks/h200_nextn_patched_gdn.sh BASELINE_E2E_JSON
set -uo pipefail
baseline=$1
OUT=${OUT:-/tmp/out}
source .gpu-kit/setup.sh >"$OUT/kit.log" 2>&1
PY=$SGLANG_KIT_PYTHON
F=$PWD/sglang_spec/fixtures/tiny-pair
lock=/tmp/e2e.lock
touch "$lock"
flock "$lock" bash -c "export PYTHONPATH=$PWD:\$PYTHONPATH
  SGLANG_SPEC_KERNEL_DEVICE=cuda timeout 200 $PY -m pytest -q -p no:cacheprovider tests/test_sglang_gdn_kernels.py
  echo pytest rc \$?
  timeout 100 $PY benchmarks/gdn_verify.py; echo gdn_verify rc \$?" >"$OUT/gdn.log" 2>&1 &
sleep 2
timeout "${E2E_LIMIT_S:-330}" "$PY" tools/gpu_e2e.py --out /tmp/e2e --target "$F/hybrid" --drafter "$F/hybrid-dflash" \
  --prompts "$F/heldout_prompts.jsonl" --servers nextn+graphs,ddtree4+patched --graph-bs 32 --sweep 1,2,4,8,16,32 \
  --baseline "$baseline" --lock "$lock" --start-timeout 240 2>&1 | tee "$OUT/e2e.log" | grep -v "it/s\]"
wait
tar -C /tmp -czf "$OUT/e2e.tgz" e2e
cat "$OUT/gdn.log"
