#!/usr/bin/env bash
# Mutation testing of the algorithm core (sglang_spec/tree, gdn, reference) and the plugin's
# validation (plugin/config.py) with mutmut, on a CPU box -- not in CI (about an hour on 2 shared cores). What is mutated and which tests run:
# [tool.mutmut] in pyproject.toml; the last run's kill rate and reviewed survivors:
# benchmarks/results/mutation.md.
#
#   bash tools/mutation_test.sh                          # every mutant
#   bash tools/mutation_test.sh 'sglang_spec.tree.walk*' # one module (mutant-name globs)
#
# mutmut works in mutants/ (git-ignored) and keeps its results there: a second call re-runs only
# the mutants it has no result for; rm -rf mutants/ to start over after changing code or tests.
# Writes the summary to mutants/summary.txt and the survivors with their diffs to
# mutants/survivors.txt. PYTHON selects the interpreter (default .venv/bin/python); mutmut 3.8.1
# is installed into it if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" -c "import mutmut" 2>/dev/null || "$PY" -m pip install -q "mutmut==3.8.1"
mkdir -p mutants
nice -n 10 "$PY" -m mutmut run --max-children "${MUTMUT_CHILDREN:-2}" "$@" >mutants/run.log 2>&1 ||
  { tail -c 2000 mutants/run.log; exit 1; }
"$PY" -m mutmut results --all true >mutants/results.txt
"$PY" - <<'PY'
import collections, pathlib, re, subprocess, sys

lines = pathlib.Path("mutants/results.txt").read_text().splitlines()
status = collections.Counter()
by_module = collections.defaultdict(collections.Counter)
survivors = []
for line in lines:
    m = re.match(r"\s*(\S+): (.+)$", line)
    if not m:
        continue
    name, state = m.groups()
    module = re.sub(r"\.x[_ǁ].*$", "", name)  # mutmut names: module.x_function__mutmut_N
    status[state] += 1
    by_module[module][state] += 1
    if state == "survived":
        survivors.append(name)
tested = status["killed"] + status["survived"] + status["timeout"]
out = [f"{sum(status.values())} mutants: " + ", ".join(f"{v} {k}" for k, v in status.most_common())]
if tested:
    out.append(f"kill rate (killed + timeout) / (killed + timeout + survived): "
               f"{(status['killed'] + status['timeout']) / tested:.1%}")
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
