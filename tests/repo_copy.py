"""A temp copy of the repository to run the pipeline in (DVC, Prefect), and the sizes that make it quick."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

TINY = {
    "prepare": {"train_games": 2, "warmup_games": 2, "valid_seen_games": 1, "valid_unseen_games": 1},
    "env": {"max_steps": 5, "history_length": 1, "workers": 2},
    "rollout": {"max_new_tokens": 12, "batch_size": 8},
    "warmup": {"epochs": 0.2, "batch_size": 4, "max_seq_len": 768},
    "evaluate": {"modes": ["greedy"], "sampled_runs": 1, "generation": {"max_new_tokens": 12}},
    "build_sft_data": {"games": 2, "samples": 1, "validation_fraction": 0.5},
    "train_analyzer": {"epochs": 0.2, "batch_size": 1, "analyzer_max_new_tokens": 16},
    "rl": {
        "epochs": 1,
        "updates_per_epoch": 1,
        "games_per_update": 1,
        "group_size": 2,
        "validation_games": 1,
        "analyzer_max_new_tokens": 16,
    },
}
# as `dvc repro` runs them (evaluate is one stage per name in evaluate.models)
STAGES = (
    "prepare", "warmup", "build_sft_data", "train_analyzer", "rl",
    "evaluate@base", "evaluate@warmup", "evaluate@rl", "eval_table",
)  # fmt: skip


def merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(base.get(k, {}), v) if isinstance(v, dict) else v
    return out


def run(cmd, cwd, env, ok=True):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if ok:
        assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def make_env(**extra) -> dict:
    return dict(
        os.environ,
        PATH=f"{BIN}:{os.environ['PATH']}",
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@t",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@t",
        **extra,
    )


def copy_repo(work: Path, params: dict, env: dict) -> None:
    """The repo's files (as git sees them) in `work`, with `params` as params.yaml, committed (DVC needs it)."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for f in files:
        if (REPO / f).is_file():
            (work / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, work / f)
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(["git", "init", "-q"], work, env)
    run(["git", "add", "-A"], work, env)
    run(["git", "commit", "-qm", "copy"], work, env)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group led by `proc` (started with start_new_session), SIGKILL if it lingers."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
