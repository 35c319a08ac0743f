#!/usr/bin/env bash
# Budget by batch size on real SGLang (issue 15 items 2 and 4), tiny hybrid pair, CUDA graphs up to bs GRAPH_BS (16):
#   source .gpu-kit/setup.sh && OUT=$OUT PARTS=fixed bash e2e/h200_adaptive.sh      # one device call
#   source .gpu-kit/setup.sh && OUT=$OUT PARTS=adaptive bash e2e/h200_adaptive.sh   # the next one
#  fixed:    AR, DFLASH, DDTREE(15) and DDTREE(63), or FIXED_SERVERS (each: greedy outputs identical to AR's sequentially
#            and concurrently, tokens per verify step, load sweep C = SWEEP, default 1..16);
#  adaptive: DDTREE with --speculative-adaptive and e2e/adaptive_budgets_tiny.json (candidates
#            15/31/63 at bs 1-3, 15/31 at 4-15, 15 from 16: a switching exercise, not a measured
#            cost table), the same checks, compared with the fixed part's AR server when it ran one
#            (--baseline); exits 1 unless the server's log shows the per-width verify states it built
#            ("DDTREE budget by batch size: target verify states ...").
# SWEEP_REQUESTS=R: requests per concurrency unit of each level (default 4; session 11's levels of 8
# requests at C = 1 and 2 were too short to tell budgets apart within 5 %). SWEEP_PASSES=P sweeps
# the SWEEP list P times over (1,2,..,1,2,..): the report and e2e.sweep_costs take each level's
# median and the report shows the spread (session 19: one pass a level moved the same servers by
# up to 1.8x between sessions). SWEEP_TOKENS=T: output tokens per sweep request (default 128; the
# tiny pair's prefill, 33-90 ms, costs about ten 3.5 ms decode steps, and a speculative server
# finishes a 128-token request in about 20 steps, so its levels from C = 4 are prefill-bound).
#  interleaved: PARTS=interleaved, the fixed servers (FIXED_SERVERS) and the adaptive one
#            (ddtree63$MODS+adaptive) up at once in ONE e2e.tiny_pair run (--interleave): the same
#            checks per server, then one load test whose levels alternate between the servers, so
#            the 5 % comparisons of issue 15's tiny bar are made within seconds, not across calls
#            (session 25: one server's level moved by up to 1.4x between passes); exits 1 unless
#            the adaptive server's log shows its per-width verify states; then prints issue 15's
#            tiny-bar verdict (python -m e2e.tiny_bar). INTERLEAVED_LIMIT_S (560) counts from this
#            script's start, not the call's: after `source .gpu-kit/setup.sh` on a fresh machine pass
#            INTERLEAVED_LIMIT_S=$((540 - SECONDS)) from the call's shell, leaving time for the verdict
#            and PACK_OUT (session 37's call 1 hit the device's limit first, and its server outlived
#            the call). The run gets --time-limit 5 s under it: its sweep starts no concurrency in
#            the last 60 s, so it stops its servers and writes its results itself (session 39's
#            runs were killed mid-pass, every server marked interrupted); `timeout` stays as the net.
# PIN_CPUS=1: --pin-cpus (each server on its own block of physical cores, the harness on the last).
# ROTATE_CPUS=1 (with PIN_CPUS, interleaved): --rotate-cpus, every server moved to the next server's
# CPU block before each pass, so that each runs on every block (session 39: the adaptive server sat
# on CPUs 10-12 in both calls and its steps were 2-10 % slower than the fixed DDTREE(63)'s at the
# same budget; its own cost or its block's).
# PACK_OUT=1 (on the device): at the end $OUT holds one file, all.tar.xz, with everything the parts
# wrote (`tar xJf all.tar.xz` here): a call returns at most 8 files (session 38 lost a sweep).
# PARTS="costs interleaved": the cost table measured on this machine first. costs: one fixed
# DDTREE server per candidate budget of ADAPTIVE_CONFIG (ddtree<B>$MODS), interleaved and rotated like
# the interleaved part, for COSTS_LIMIT_S (260) from this script's start; then e2e.sweep_costs --base
# ADAPTIVE_CONFIG writes $OUT/costs/adaptive_config.json (the config with every measured cell
# replaced), which the interleaved part's adaptive server then runs (session 40: the shipped tiny
# table, measured in session 16 before fused norms and commit graphs, priced DDTREE(63)'s step at
# 7.55 ms at C = 1 where the fixed server now takes 3.8, and 15 5 % cheaper than 63, so bucket 1
# ran the chain). COSTS_KEEP=FILE also copies the table there (e.g. .whl/tiny_costs.json: ignored
# paths outlive a call on a warm device machine, for a second call's ADAPTIVE_CONFIG).
# ADAPTIVE_CONFIG=FILE replaces the switching exercise with a measured table: between the two
# calls, on any machine,
#   python -m e2e.sweep_costs $OUT/fixed/sweeps/ddtree*.jsonl --write-config e2e/adaptive_budgets_tiny_h200.json
# (give the device OUT=$OUT itself: it returns files at most 2 folders down, so fixed/sweeps/ comes back).
# NUM_PROMPTS=N: prompts for the greedy and tokens-per-step checks (default 6; issue 15's 1.3x was
# missed at 1.29x on 6 held-out prompts in session 11, where the reference engine gives 1.39x on 16).
# DIST_SAMPLES=N adds the 2-token samples `python -m e2e.sampling_check` tests against the target's
# exact float32 law (offline, on the CPU). PROMPTS=$F/othercode_prompts.jsonl runs on click's code, which the pair never saw (issue 15 item 4).
# The DDTREE servers run as a hybrid deployment would: MODS (default +graphs+patched+replayssm: CUDA
# graphs, the patch series applied, the GDN tree ReplaySSM). Both parts together took more than one
# 10-minute call in session 7, hence PARTS. Exits 1 when either part fails (a timeout included).
set -uo pipefail
OUT=${OUT:-/tmp/h200_adaptive}
mkdir -p "$OUT"
F=$PWD/sglang_spec/fixtures/tiny-pair
export PYTHONUNBUFFERED=1
MODS=${MODS-+graphs+patched+replayssm}
PARTS=${PARTS:-fixed adaptive}
passes=${SWEEP_PASSES:-1}
[[ $passes =~ ^[1-9][0-9]*$ ]] || { echo "SWEEP_PASSES=$passes: give a whole number >= 1" >&2; exit 2; }
pass_levels=${SWEEP:-1,2,4,8,16}
levels=$pass_levels
for ((p = 1; p < passes; p++)); do levels=$levels,$pass_levels; done
common=(--target "$F/hybrid" --drafter "$F/hybrid-dflash" --prompts "${PROMPTS:-$F/heldout_prompts.jsonl}"
  --num-prompts "${NUM_PROMPTS:-6}"
  --graph-bs "${GRAPH_BS:-16}" --sweep "$levels" --sweep-requests "${SWEEP_REQUESTS:-4}"
  --sweep-tokens "${SWEEP_TOKENS:-128}")
[ -n "${PIN_CPUS:-}" ] && common+=(--pin-cpus)
rc=0
# Every +adaptive server of an e2e.json (all servers when none is marked: the adaptive part's) ran
# and logged the per-width verify states it built (session 7: a leftover server answered instead).
verify_states() {
  "$SGLANG_KIT_PYTHON" -c 'import json, sys
runs = json.load(open(sys.argv[1]))
adaptive = [r for r in runs if "+adaptive" in r["label"]] or runs
ok = bool(adaptive)
for r in adaptive:
    states = [ln for ln in r.get("log_ddtree", []) if "budget by batch size: target verify states" in ln]
    print(r["label"], "ok" if r["ok"] else "FAILED", *states, sep="\n  ")
    ok &= bool(r["ok"] and states)
sys.exit(0 if ok else 1)' "$1"
}
if [[ " $PARTS " == *" fixed "* ]]; then
  dist=()  # DIST_SAMPLES=N: 2-token samples for the chi-square against the exact law (issue 14 item 3)
  [ -n "${DIST_SAMPLES:-}" ] && dist=(--dist-samples "$DIST_SAMPLES" --dist-servers "ar+graphs,ddtree63${MODS}")
  timeout "${FIXED_LIMIT_S:-540}" "$SGLANG_KIT_PYTHON" -m e2e.tiny_pair --out "$OUT/fixed" "${common[@]}" \
    "${dist[@]}" \
    --servers "${FIXED_SERVERS:-ar+graphs,dflash+graphs,ddtree15${MODS},ddtree63${MODS}}" \
    >"$OUT/fixed.log" 2>&1
  status=$?
  echo "fixed rc $status" | tee -a "$OUT/fixed.log"
  [ $status -eq 0 ] || rc=1  # session 17: a part cut by its timeout still printed its table
  tail -n 30 "$OUT/fixed.log"
fi
if [[ " $PARTS " == *" adaptive "* ]]; then
  # compared with the fixed part's AR outputs when it ran a successful AR server (session 22: a
  # fixed part without AR made --baseline refuse, and the adaptive server never ran)
  baseline=()
  if [ -f "$OUT/fixed/e2e.json" ] && "$SGLANG_KIT_PYTHON" -c 'import json, sys
sys.exit(0 if any(r["label"].startswith("ar") and r["ok"] for r in json.load(open(sys.argv[1]))) else 1)' "$OUT/fixed/e2e.json"; then
    baseline=(--baseline "$OUT/fixed/e2e.json")
  elif [ -f "$OUT/fixed/e2e.json" ]; then
    echo "adaptive: the fixed part has no successful AR server; greedy outputs not compared with AR"
  fi
  timeout "${ADAPTIVE_LIMIT_S:-300}" "$SGLANG_KIT_PYTHON" -m e2e.tiny_pair --out "$OUT/adaptive" \
    "${common[@]}" "${baseline[@]}" --servers "ddtree63${MODS}" \
    --server-arg speculative-adaptive \
    --server-arg "speculative-adaptive-config=${ADAPTIVE_CONFIG:-$PWD/e2e/adaptive_budgets_tiny.json}" >"$OUT/adaptive.log" 2>&1
  echo "adaptive rc $?" | tee -a "$OUT/adaptive.log"
  verify_states "$OUT/adaptive/e2e.json" || { echo "adaptive: no verify-states log line"; rc=1; }
  tail -n 30 "$OUT/adaptive.log"
fi
rotate=()
[ -n "${ROTATE_CPUS:-}" ] && rotate=(--rotate-cpus)
if [[ " $PARTS " == *" costs "* ]]; then
  base=${ADAPTIVE_CONFIG:?PARTS=costs measures the candidates of ADAPTIVE_CONFIG: give one}
  servers=$("$SGLANG_KIT_PYTHON" -c 'import sys
from sglang_spec.plugin.config import load_budget_policy
print(",".join(f"ddtree{b}{sys.argv[2]}" for b in load_budget_policy(sys.argv[1]).budgets))' "$base" "$MODS") || exit 2
  left=$((${COSTS_LIMIT_S:-260} - SECONDS))
  timeout "$left" "$SGLANG_KIT_PYTHON" -m e2e.tiny_pair --out "$OUT/costs" "${common[@]}" \
    --interleave --time-limit "$((left - 5))" --servers "$servers" "${rotate[@]}" >"$OUT/costs.log" 2>&1
  status=$?
  echo "costs rc $status" | tee -a "$OUT/costs.log"
  tail -n 12 "$OUT/costs.log"
  if [ $status -eq 0 ] && "$SGLANG_KIT_PYTHON" -m e2e.sweep_costs "$OUT"/costs/sweeps/ddtree*.jsonl \
    --base "$base" --write-config "$OUT/costs/adaptive_config.json"; then
    ADAPTIVE_CONFIG=$OUT/costs/adaptive_config.json
    [ -n "${COSTS_KEEP:-}" ] && cp "$ADAPTIVE_CONFIG" "$COSTS_KEEP"
  else
    rc=1
    PARTS=${PARTS/interleaved/}  # not the adaptive server on the stale table it was to replace
    echo "costs: no measured table; the interleaved part does not run"
  fi
fi
if [[ " $PARTS " == *" interleaved "* ]]; then
  left=$((${INTERLEAVED_LIMIT_S:-560} - SECONDS))  # from this script's start
  timeout "$left" "$SGLANG_KIT_PYTHON" -m e2e.tiny_pair --out "$OUT/interleaved" \
    "${common[@]}" --interleave --time-limit "$((left - 5))" \
    --servers "${FIXED_SERVERS:-ar+graphs,dflash+graphs,ddtree15${MODS},ddtree63${MODS}},ddtree63${MODS}+adaptive" \
    "${rotate[@]}" \
    --adaptive-config "${ADAPTIVE_CONFIG:-$PWD/e2e/adaptive_budgets_tiny.json}" >"$OUT/interleaved.log" 2>&1
  status=$?
  echo "interleaved rc $status" | tee -a "$OUT/interleaved.log"
  [ $status -eq 0 ] || rc=1
  verify_states "$OUT/interleaved/e2e.json" || { echo "interleaved: no verify-states log line"; rc=1; }
  tail -n 40 "$OUT/interleaved.log"
  # issue 15's tiny bar from this run's interleaved levels (a measurement: it does not set rc)
  "$SGLANG_KIT_PYTHON" -m e2e.tiny_bar "$OUT/interleaved/sweeps" --json "$OUT/interleaved/tiny_bar.json"
fi
if [ -n "${PACK_OUT:-}" ]; then
  pack=$(mktemp -d)
  # xz -1 on every core: session 39's call 6 left a few seconds after its harness stopped its
  # servers (11 s) and the verdict ran, and a single-threaded xz -6 did not finish in them
  tar cf - -C "$OUT" . | xz -1 -T0 >"$pack/all.tar.xz" && rm -rf "${OUT:?}"/* && mv "$pack/all.tar.xz" "$OUT/" || rc=1
  rmdir "$pack"
fi
exit $rc
