#!/bin/bash
# Run the comparison's remaining runs one at a time, seed-major (every arm's seed 0, then seed 1, ...), and land each
# finished run in this repository: its folder here, a line in wall_times.txt, sweep.json merged, one commit. A run
# already here is skipped, so a session cut off mid-run only loses that run's progress (or not even that: in the
# same runner checkout the sweep resumes a cut-off run after its last complete epoch).
#
#   bash reports/sokoban-comparison/run_remaining.sh RUNNER_DIR [ARM ...]     # arms default to the recipe's five
#
# RUNNER_DIR is a checkout of the runner commit with the start restored; it is made (about 4 minutes) when missing.
# Run it in the background, alone on the CPU: nohup setsid bash reports/sokoban-comparison/run_remaining.sh ../cmp &
set -euo pipefail
RUNNER_COMMIT=6749425
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(git -C "$HERE" rev-parse --show-toplevel)
RUNNER=$(realpath -m "${1:?usage: run_remaining.sh RUNNER_DIR [ARM ...]}")
shift
ARMS=("$@")
[ ${#ARMS[@]} -gt 0 ] || ARMS=(grpo seed seed_shuffled seed_oracle seed_lambda0.1)
MACHINE="$(lscpu | sed -n 's/^Model name: *//p' | head -1)$(grep -q amx_tile /proc/cpuinfo && echo ' (AMX)'), $(nproc) cores"

# dvc runs the stages' `python` from PATH: the runner's venv must come first already while the runner is made
export PATH="$RUNNER/.venv/bin:$PATH" DVC_NO_ANALYTICS=1 PREFECT_SERVER_ANALYTICS_ENABLED=false
if [ ! -f "$RUNNER/.venv/.runner-ready" ]; then   # written last, so a making cut off part-way is taken up again
  echo "making the runner at $RUNNER (commit $RUNNER_COMMIT) with the kept start"
  [ -d "$RUNNER/.git" ] || git clone -q "$REPO" "$RUNNER"
  git -C "$RUNNER" checkout -q -B comparison-runner "$RUNNER_COMMIT"
  (cd "$RUNNER" && make setup && cp recipes/sokoban.yaml params.yaml && dvc repro -s prepare &&
    python "$HERE/start/restore.py" . && dvc commit -f warmup build_sft_data train_analyzer)
  touch "$RUNNER/.venv/.runner-ready"
fi
[ "$(git -C "$RUNNER" rev-parse --short=7 HEAD)" = "$RUNNER_COMMIT" ] ||
  { echo "error: $RUNNER is not at the runner commit $RUNNER_COMMIT: every arm must run the same code"; exit 1; }

for s in 0 1 2; do
  for arm in "${ARMS[@]}"; do
    run="$arm-s$s"
    [ -d "$HERE/$run" ] && continue
    recipe=$(mktemp --suffix=.yaml)   # the recipe with this one seed: a fresh runner knows no earlier run
    sed "s/^seeds: *[0-9]*/seeds: [$s]/" "$RUNNER/recipes/sweeps/sokoban-comparison.yaml" >"$recipe"
    echo "$run: started $(date -u '+%F %H:%M') on $MACHINE"
    t0=$(date +%s)
    rc=0
    (cd "$RUNNER" && seed sweep "$recipe" --methods "$arm" --run --results reports/sokoban-comparison) \
      >"$RUNNER/sweep-$run.log" 2>&1 || rc=$?
    secs=$(($(date +%s) - t0))
    rm -f "$recipe"
    if [ "$rc" != 0 ] || [ ! -f "$RUNNER/reports/sokoban-comparison/$run/metrics/eval.json" ]; then
      echo "$run: failed (rc $rc, $secs s); see $RUNNER/sweep-$run.log"
      exit 1
    fi
    cp -r "$RUNNER/reports/sokoban-comparison/$run" "$HERE/"
    python3 - "$RUNNER/reports/sokoban-comparison/sweep.json" "$HERE/sweep.json" <<'EOF'
import json, os, sys
runner, here = sys.argv[1:]
merged = {e["name"]: e for e in (json.load(open(here)) if os.path.exists(here) else [])}
merged.update({e["name"]: e for e in json.load(open(runner))})   # a run made again replaces its entry
json.dump(list(merged.values()), open(here + ".tmp", "w"), indent=2)
os.replace(here + ".tmp", here)
EOF
    echo "$run rc=0 $secs s $(date -u '+%F %H:%M') $MACHINE (seed sweep, evaluation included)" >>"$HERE/wall_times.txt"
    git -C "$REPO" add "$HERE"
    git -C "$REPO" commit -q -m "Sokoban comparison: $run on the kept start ($((secs / 60)) min, $MACHINE)"
    echo "$run: landed ($secs s)"
  done
done
