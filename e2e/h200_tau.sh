#!/usr/bin/env bash
# Tokens per verify step of DFLASH and DDTREE(63) on real SGLang, both tiny pairs, the held-out
# prompts and another code base's (issue 15 item 4), in one device call:
#   source .gpu-kit/setup.sh && OUT=$OUT bash e2e/h200_tau.sh
# One prompt file holds NUM_PROMPTS (16) of each set, tagged (python -m e2e.tau_report
# --write-prompts), so each pair needs one server per algorithm: python -m e2e.tiny_pair with
# DFLASH, DDTREE(63) and AR, CUDA graphs, the patch series applied (the hybrid's DDTREE also with
# the GDN tree ReplaySSM), greedy requests only, per pair in PAIRS (default "hybrid qwen3") into
# $OUT/<pair>/e2e.json. AR comes last: a pair out of its PAIR_LIMIT_S (250 s) loses its greedy
# check, not its tau. Then python -m e2e.tau_report over the runs ($OUT/tau.json). Judge a
# greedy difference from AR on the CPU: python -m e2e.compare_reference $OUT/<pair>/e2e.json
# --pair <pair> --prompts $OUT/prompts.jsonl --num-prompts 32. The compile caches are saved to
# $OUT/compile-cache.tar.xz for the next call (e2e/compile_cache.sh): session 18's cold machine
# took 141 s to start the hybrid pair's first server, and both pairs ran out of their 255 s.
# MAX_NEW_TOKENS (64) sets the greedy requests' length: at 64 a prompt's tau is 64 / steps, and
# near tau 9 one step more or less moves it by 12-14 %. SKIP_AR=1 leaves the AR server out (judge
# the greedy outputs against the reference engine on the CPU instead).
set -uo pipefail
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
F=$PWD/sglang_spec/fixtures/tiny-pair
PY=${SGLANG_KIT_PYTHON:?source .gpu-kit/setup.sh first}
export PYTHONUNBUFFERED=1
bash e2e/compile_cache.sh restore
"$PY" -m e2e.tau_report --write-prompts "$OUT/prompts.jsonl" --num-prompts "${NUM_PROMPTS:-16}" || exit 1
n=$(grep -c . "$OUT/prompts.jsonl")
rc=0
runs=()
for pair in ${PAIRS:-hybrid qwen3}; do
  tree=ddtree63+graphs+patched
  [ "$pair" = hybrid ] && tree=$tree+replayssm
  servers=dflash+graphs,$tree
  [ -n "${SKIP_AR:-}" ] || servers=$servers,ar+graphs
  timeout "${PAIR_LIMIT_S:-250}" "$PY" -m e2e.tiny_pair --out "$OUT/$pair" --target "$F/$pair" \
    --drafter "$F/$pair-dflash" --prompts "$OUT/prompts.jsonl" --num-prompts "$n" --samples 0 \
    --graph-bs 16 --max-new-tokens "${MAX_NEW_TOKENS:-64}" \
    --servers "$servers" >"$OUT/$pair.log" 2>&1
  status=$?
  echo "$pair rc $status" | tee -a "$OUT/$pair.log"
  [ $status -eq 0 ] || rc=1
  tail -n 6 "$OUT/$pair.log"
  runs+=("$pair=$OUT/$pair/e2e.json")
done
"$PY" -m e2e.tau_report "${runs[@]}" --prompts "$OUT/prompts.jsonl" --json "$OUT/tau.json" || rc=1
bash e2e/compile_cache.sh save "$OUT"
exit $rc
