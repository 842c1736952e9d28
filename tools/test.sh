#!/usr/bin/env bash
# `make test`: every tier that can run here, in two phases, then the time per tier.
#   1. everything but the `serial` tests, two at a time (pytest-xdist, one test file per worker at a
#      time, so a notebook's cells and a file's shared fixtures stay in one process): about half of
#      a one-at-a-time run waits on launchers, timeouts and schedulers with a core idle;
#   2. the `serial` tests alone: they check state the whole machine shares (/dev/shm, every
#      ipyparallel process), which a test beside them would change, or time real seconds.
# WORKERS=1 runs phase 1 one test at a time, as `make test` did before.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
python=.venv/bin/python
workers=${WORKERS:-2}
times=$(mktemp) results=$(mktemp -d)
trap 'rm -rf "$times" "$results"' EXIT
export SCALEDL_TIER_TIMES=$times PATH="$PWD/.venv/bin:$PATH"
# Each test's time as it ends (tests/conftest.py), kept even when a run is cut off (runs/ is not tracked);
# a whole run's become runs/last-test/times.tsv, the order of the next run's files.
mkdir -p runs/last-test && rm -f runs/last-test/running.tsv
export SCALEDL_TIMES_LOG=$PWD/runs/last-test/running.tsv
parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder)  # the files in conftest.py's order: longest first
[ "$workers" -gt 1 ] || parallel=()
status=0
start=$(date +%s)
"$python" -m pytest -q --durations=10 "${parallel[@]}" -m "not serial" --nbval-lax --nbval-current-env \
    --junitxml "$results/parallel.xml" tests solutions notebooks/*.ipynb || status=$?
middle=$(date +%s)
"$python" -m pytest -q --durations=3 -m serial --nbval-lax --nbval-current-env --junitxml "$results/serial.xml" \
    tests solutions notebooks/*.ipynb ||
    { code=$?; [ "$code" -eq 5 ] || status=$code; }
end=$(date +%s)
"$python" - "$times" "$((middle - start))" "$((end - middle))" "$workers" "$results" <<'PY'
import json, pathlib, sys
import xml.etree.ElementTree as ET
totals, first, second, workers = json.load(open(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
order = ["unit", "slow", "mpich", "slurm", "browser", "gpu", "notebooks"]
print(f"\n== time per tier (the tests' own time, summed; phase 1 ran {workers} at a time)")
for tier in sorted(totals, key=lambda t: order.index(t) if t in order else len(order)):
    seconds, count = totals[tier]
    print(f"{tier:>10}: {seconds / 60:6.1f} min in {count} tests")
print(f"{'wall':>10}: {(first + second) / 60:6.1f} min (phase 1 {first / 60:.1f}, serial {second / 60:.1f})")
counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
for xml in pathlib.Path(sys.argv[5]).glob("*.xml"):
    for suite in ET.parse(xml).getroot().iter("testsuite"):
        for key in counts:
            counts[key] += int(suite.get(key, 0))
failed = counts["failures"] + counts["errors"]
print(f"both phases: {counts['tests'] - failed - counts['skipped']} passed, {failed} failed, "
      f"{counts['skipped']} skipped")
PY
# Every test's own time, kept for the next look at what makes `make test` long and for the next run's order
# (the junit XML above holds the same times: it is only read for the counts).
mv runs/last-test/running.tsv runs/last-test/times.tsv
exit "$status"
