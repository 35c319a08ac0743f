#!/usr/bin/env bash
# Host profile of every SGLang scheduler serving on this machine, taken in the background of a
# served run (py-spy, sampling the process's memory without stopping it):
#   PYSPY=.whl/pyspy/py-spy OUT=$OUT DELAY_S=240 DURATION_S=180 bash e2e/profile_schedulers.sh &
# waits DELAY_S, then samples each process titled sglang::scheduler for DURATION_S at RATE Hz
# (default 250) into $OUT/pyspy/port<N>.txt: folded stacks with their sample counts (py-spy's raw
# format; idle samples left out), N the --port of the launch_server process that started it. The
# tiny pair's decode step is host-bound (its scheduler is on a CPU ~98 % of each chunk gap, the GPU
# busy ~20 %), so these shares are where its step time goes; `python -m e2e.scheduler_profile`
# compares the servers. py-spy runs on the machine's last CPU, the harness's block.
# Get py-spy (no install needed; an ignored path the device call carries):
#   pip download py-spy --no-deps -d /tmp/w && python -m zipfile -e /tmp/w/py_spy-*.whl /tmp/w/x
#   mkdir -p .whl/pyspy && cp /tmp/w/x/py_spy-*.data/scripts/py-spy .whl/pyspy/ && chmod +x .whl/pyspy/py-spy
set -uo pipefail
PYSPY=${PYSPY:-.whl/pyspy/py-spy}
OUT=${OUT:?set OUT}
DELAY_S=${DELAY_S:-240}
DURATION_S=${DURATION_S:-180}
RATE=${RATE:-250}
for v in DELAY_S DURATION_S RATE; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "$v=${!v}: give a whole number of seconds (RATE: Hz)" >&2; exit 2; }
done
[[ -x $PYSPY ]] || { echo "PYSPY=$PYSPY: not an executable py-spy (see this script's header)" >&2; exit 2; }
mkdir -p "$OUT/pyspy"
sleep "$DELAY_S"
last=$(($(nproc) - 1))
pids=()
for pid in $(pgrep -f '^sglang::scheduler'); do
  parent=$(ps -o ppid= -p "$pid" | tr -d ' ')
  port=$(tr '\0' ' ' <"/proc/$parent/cmdline" | grep -oE -- '--port[ =][0-9]+' | grep -oE '[0-9]+$')
  taskset -c "$last" "$PYSPY" record --pid "$pid" --duration "$DURATION_S" --rate "$RATE" \
    --nonblocking --format raw -o "$OUT/pyspy/port${port:-unknown-$pid}.txt" \
    >"$OUT/pyspy/port${port:-unknown-$pid}.log" 2>&1 &
  pids+=($!)
done
[[ ${#pids[@]} -gt 0 ]] || { echo "no sglang::scheduler process to profile" >&2; exit 1; }
wait "${pids[@]}"
