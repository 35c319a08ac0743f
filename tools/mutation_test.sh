#!/usr/bin/env bash
# Mutation testing of the algorithm core (sglang_spec/tree, gdn, reference), the launcher
# (sglang_spec/serving) and the plugin's validation, budget by batch size, simulated acceptance,
# verify input and stage timer (plugin/config.py, budget.py, simulate.py, verify_input.py,
# stage_times.py) with mutmut, on a CPU
# box -- not in CI (3-10 s a mutant on 2 shared
# cores, about 3 hours for all of them). What is mutated and which tests run: [tool.mutmut] in
# pyproject.toml; the kill rates and reviewed survivors: benchmarks/results/mutation.md.
#
#   bash tools/mutation_test.sh                          # every mutant
#   bash tools/mutation_test.sh 'sglang_spec.tree.walk*' # one module (mutant-name globs)
#   MUTMUT_SAMPLE=150 bash tools/mutation_test.sh 'sglang_spec.gdn.*'
#       # a uniform random sample of 150 of the matching mutants: the sorted names shuffled with
#       # random.Random(MUTMUT_SEED, default 18), the first 150; the summary gives its kill rate
#       # with a 95 % Wilson interval. A larger MUTMUT_SAMPLE with the same seed extends the sample.
#
# mutmut works in mutants/ (git-ignored) and keeps its results there: a second call without globs
# re-runs only the mutants it has no result for (named or globbed mutants are always re-run);
# rm -rf mutants/ to start over after changing code or tests. Writes the summary of the mutants
# this call selected to mutants/summary.txt and their survivors with diffs to
# mutants/survivors.txt. PYTHON selects the interpreter (default .venv/bin/python); mutmut 3.8.1 is
# installed into it if missing. MUTMUT_CHILDREN: parallel mutants (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" -c "import mutmut" 2>/dev/null || "$PY" -m pip install -q "mutmut==3.8.1"
mkdir -p mutants
mutmut_run() {
  nice -n 10 "$PY" -m mutmut run --max-children "${MUTMUT_CHILDREN:-2}" "$@" >mutants/run.log 2>&1 ||
    { tail -c 2000 mutants/run.log; exit 1; }
}
selected=("$@")
if [ -n "${MUTMUT_SAMPLE:-}" ]; then
  # the mutant names exist once mutmut has generated them: a first run of a few mutants does that
  compgen -G "mutants/sglang_spec/*/*.meta" >/dev/null || mutmut_run 'sglang_spec.plugin.config.x__flag*'
  "$PY" -m mutmut results --all true >mutants/results.txt
  mapfile -t selected < <("$PY" - "${MUTMUT_SAMPLE}" "${MUTMUT_SEED:-18}" "${@:-*}" <<'PY'
import fnmatch, random, re, sys

size, seed, globs = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
names = sorted(
    m.group(1)
    for line in open("mutants/results.txt")
    if (m := re.match(r"\s*(\S+): ", line)) and any(fnmatch.fnmatch(m.group(1), g) for g in globs)
)
random.Random(seed).shuffle(names)
print("\n".join(names[:size]))
PY
  )
  echo "sample: ${#selected[@]} mutants of $* (seed ${MUTMUT_SEED:-18})"
fi
mutmut_run "${selected[@]}"
"$PY" -m mutmut results --all true >mutants/results.txt
printf '%s\n' "${selected[@]}" >mutants/selected.txt
"$PY" - "${MUTMUT_SAMPLE:+sample}" <<'PY'
import collections, fnmatch, math, pathlib, re, subprocess, sys

globs = [g for g in pathlib.Path("mutants/selected.txt").read_text().splitlines() if g] or ["*"]
status = collections.Counter()
by_module = collections.defaultdict(collections.Counter)
survivors = []
for line in pathlib.Path("mutants/results.txt").read_text().splitlines():
    m = re.match(r"\s*(\S+): (.+)$", line)
    if not m or not any(fnmatch.fnmatch(m.group(1), g) for g in globs):
        continue
    name, state = m.groups()
    module = re.sub(r"\.x[_ǁ].*$", "", name)  # mutmut names: module.x_function__mutmut_N
    status[state] += 1
    by_module[module][state] += 1
    if state == "survived":
        survivors.append(name)
caught = status["killed"] + status["timeout"]
tested = caught + status["survived"]
out = [f"{sum(status.values())} mutants: " + ", ".join(f"{v} {k}" for k, v in status.most_common())]
if tested:
    rate = f"kill rate (killed + timeout) / (killed + timeout + survived): {caught / tested:.1%}"
    if sys.argv[1:] == ["sample"]:  # 95 % Wilson score interval of a binomial proportion
        z, p = 1.96, caught / tested
        mid = (p + z * z / (2 * tested)) / (1 + z * z / tested)
        half = z * math.sqrt(p * (1 - p) / tested + z * z / (4 * tested**2)) / (1 + z * z / tested)
        rate += f", 95 % interval {mid - half:.1%} - {mid + half:.1%} (a sample)"
    out.append(rate)
out += ["", "| module | " + " | ".join(k for k, _ in status.most_common()) + " |",
        "|---|" + "---|" * len(status)]
for module, c in sorted(by_module.items()):
    out.append(f"| {module} | " + " | ".join(str(c[k]) for k, _ in status.most_common()) + " |")
pathlib.Path("mutants/summary.txt").write_text("\n".join(out) + "\n")
print("\n".join(out))
with open("mutants/survivors.txt", "w") as f:
    for name in survivors:
        diff = subprocess.run([sys.executable, "-m", "mutmut", "show", name],
                              capture_output=True, text=True).stdout
        f.write(f"## {name}\n{diff}\n")
print(f"{len(survivors)} survivors with diffs in mutants/survivors.txt")
PY
