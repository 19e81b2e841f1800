#!/bin/bash
# The calibration runs of this folder, step by step, in a scratch clone of the repository (one torch job at a time:
# each step waits for the one before). Usage, from the clone's root, with `make install` done:
#   bash reports/sokoban-calibration/run.sh prepare warmup eval-warmup stage1 grpo-s1 grpo-s2
# Steps:
#   prepare, warmup, eval-warmup   the calibrated start (warmup-48-offpath/params.yaml)
#   stage1                         build_sft_data, train_analyzer, the analyzer as a policy, and its uplift and credit
#                                  probes (stage1-played/params.yaml)
#   grpo-sN                        GRPO seed N from the warm-up, then its held-out evaluation (warmup-48-offpath/grpo-sN/)
# Each step logs to log-<step>.txt and appends its wall time to wall_times.txt; outputs go to models/, data/, out/.
set -euo pipefail
HERE=$(dirname "$0")
START=$HERE/warmup-48-offpath
export PATH=$PWD/.venv/bin:$PATH PYTHONPATH=$PWD DVC_NO_ANALYTICS=1 PREFECT_SERVER_ANALYTICS_ENABLED=false

timed() {  # timed NAME cmd...: run, log, and record the wall time
  local name=$1 t0=$SECONDS rc=0
  shift
  "$@" >"log-$name.txt" 2>&1 || rc=$?
  echo "$name rc=$rc $((SECONDS - t0)) s" >>wall_times.txt
  return $rc
}

cp "$START/params.yaml" params.yaml
for step in "$@"; do
  case $step in
    prepare) timed prepare python flows/prepare.py ;;
    warmup) timed warmup python flows/warmup.py --metrics out/warmup.json ;;
    eval-warmup) timed eval-warmup python flows/evaluate.py --model warmup --metrics-dir out/warmup ;;
    stage1)
      p=$HERE/stage1-played/params.yaml
      timed s1-build python flows/build_sft_data.py --params "$p" --out-dir data/sft-s1 --metrics out/stage1/sft_data.json
      timed s1-train python flows/train_analyzer.py --params "$p" --sft-data data/sft-s1 --out-dir models/analyzer \
        --metrics out/stage1/train_analyzer.json --heldout out/stage1/heldout.jsonl
      timed s1-eval python flows/evaluate.py --model analyzer --params "$p" --metrics-dir out/stage1
      timed s1-uplift seed probe --params "$p" --model models/analyzer --parts uplift --out out/stage1/uplift.json
      timed s1-credit seed probe --params "$p" --model models/analyzer --parts credit --games 16 \
        --out out/stage1/credit.json --trajectories out/stage1/credit_steps.jsonl
      ;;
    grpo-s*)
      p=$START/$step/params.yaml
      timed "$step" python flows/rl.py --params "$p" --runs-dir "runs/$step" --out-dir "models/$step" \
        --metrics "out/$step/rl.json" --plots "out/$step/rl_updates.json"
      timed "eval-$step" python flows/evaluate.py --model "$step" --model-dir "models/$step" --params "$p" --metrics-dir "out/$step"
      ;;
    *) echo "unknown step '$step': prepare, warmup, eval-warmup, stage1 or grpo-s<N>" >&2 && exit 2 ;;
  esac
done
