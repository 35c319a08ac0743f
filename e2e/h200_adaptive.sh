#!/usr/bin/env bash
# Budget by batch size on real SGLang (issue 15 item 2), tiny hybrid pair, CUDA graphs up to bs 16:
#   source .gpu-kit/setup.sh && OUT=$OUT bash e2e/h200_adaptive.sh
#  1. AR, DDTREE(15) and DDTREE(63) fixed, then DDTREE with --speculative-adaptive and
#     e2e/adaptive_budgets_tiny.json (candidates 15/31/63 at bs 1-3, 15/31 at 4-15, 15 from 16: a
#     switching exercise, not a measured cost table), each: greedy outputs identical to AR's
#     sequentially and concurrently, tokens per verify step, load sweep C = 1..16;
#     The DDTREE servers run as a hybrid deployment would: MODS (default +graphs+patched+replayssm:
#     CUDA graphs, the patch series applied, the GDN tree ReplaySSM);
#  2. the adaptive server's DDTREE log lines (kept in e2e.json) must show the per-width verify
#     states it built ("DDTREE budget by batch size: target verify states ...").
set -uo pipefail
OUT=${OUT:-/tmp/h200_adaptive}
mkdir -p "$OUT"
F=$PWD/sglang_spec/fixtures/tiny-pair
export PYTHONUNBUFFERED=1
MODS=${MODS-+graphs+patched+replayssm}
common=(--target "$F/hybrid" --drafter "$F/hybrid-dflash" --prompts "$F/heldout_prompts.jsonl"
  --graph-bs 16 --sweep "${SWEEP:-1,2,4,8,16}")
timeout "${FIXED_LIMIT_S:-300}" "$SGLANG_KIT_PYTHON" -m e2e.tiny_pair --out "$OUT/fixed" "${common[@]}" \
  --servers "ar+graphs,ddtree15${MODS},ddtree63${MODS}" >"$OUT/fixed.log" 2>&1
echo "fixed rc $?" | tee -a "$OUT/fixed.log"
timeout "${ADAPTIVE_LIMIT_S:-200}" "$SGLANG_KIT_PYTHON" -m e2e.tiny_pair --out "$OUT/adaptive" "${common[@]}" \
  --baseline "$OUT/fixed/e2e.json" --servers "ddtree63${MODS}" \
  --server-arg speculative-adaptive \
  --server-arg "speculative-adaptive-config=$PWD/e2e/adaptive_budgets_tiny.json" >"$OUT/adaptive.log" 2>&1
echo "adaptive rc $?" | tee -a "$OUT/adaptive.log"
"$SGLANG_KIT_PYTHON" -c 'import json, sys
for r in json.load(open(sys.argv[1])):
    print(r["label"], "ok" if r["ok"] else "FAILED", *[ln for ln in r.get("log_ddtree", [])
          if "budget by batch size" in ln or "DDTREE resolved" in ln], sep="\n  ")' "$OUT/adaptive/e2e.json"
tail -n 25 "$OUT/fixed.log"
tail -n 25 "$OUT/adaptive.log"
