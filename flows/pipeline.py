"""Prefect flow running the whole DVC pipeline (`dvc repro`, or `dvc exp run` with parameter overrides).

DVC decides what is stale and records every hash in dvc.lock; each stage's command runs its own stage flow,
so the UI shows the pipeline run and, under the same server, one run per executed stage. The stages get
$SEED_PIPELINE_RUN (this flow run's id), which groups their W&B runs.

Failures are flow failures (state Failed), never crashes: bad parameters (params.yaml with the `-S`
overrides applied) are refused before DVC starts, with the same message as `seed params`; a failing stage
fails the flow with the stage's own `error:` lines and DVC's exit code. The pipeline itself is never
retried (training is not flaky); only `dvc push` to the remote is.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.runtime import flow_run

from _common import REPO, main, parser  # sets Prefect defaults first
from seed_core.records import ERROR_PREFIX, exit_with_error
from seed_core.tools.sweep import check_params, parse_set_params
from seed_core.tracking import Tracker

ERROR_LINES = 8
"""Lines quoted in the flow's failure message: the failing stage's `error:` lines (a user error) or the last
line of its traceback (`ValueError: ...`), and DVC's `ERROR:` lines."""
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception): ")


class PipelineError(RuntimeError):
    """`dvc repro` / `dvc exp run` failed; the message carries the stage's error lines."""


def stage_env(run_id: str) -> dict[str, str]:
    """The stages' environment: this process's, minus the Prefect engine's per-run internals (`PREFECT__*`, which
    would make a stage flow believe it is this run), plus the W&B group and DVC's analytics switch. This
    interpreter's bin folder goes first on PATH: a served run has no activated venv, and dvc.yaml says `python`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT__")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("SEED_PIPELINE_RUN", run_id)
    env["DVC_NO_ANALYTICS"] = "1"
    return env


def run_dvc(cmd: list[str], env: dict[str, str]) -> None:
    """Run DVC, echoing its output (and the stages') to stdout; on failure raise with the error lines."""
    log = get_run_logger()
    stage_errors, exceptions, dvc_errors = [], [], []
    with subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            text = line.strip()
            if text.startswith("Running stage"):
                log.info(text)
            elif text.startswith("ERROR"):
                dvc_errors.append(text)
            elif text.startswith(ERROR_PREFIX.strip()):
                stage_errors.append(text)
            elif EXCEPTION_LINE.match(text):
                exceptions.append(text)
    if proc.returncode != 0:
        lines = list(dict.fromkeys(stage_errors[-ERROR_LINES:] or exceptions[-1:])) + list(dict.fromkeys(dvc_errors))
        detail = "\n".join(lines) or "see the stage output above"
        raise PipelineError(f"`{' '.join(cmd)}` failed with exit code {proc.returncode}:\n{detail}")


@task(name="dvc-push", retries=3, retry_delay_seconds=[10, 60, 300])
def push(env: dict[str, str]) -> None:
    """Outputs (checkpoints, SFT data, skill corpora) to the default DVC remote; the network may be flaky."""
    run_dvc(["dvc", "push"], env)


@flow(name="seed-pipeline")
def pipeline(
    target: str | None = None, set_params: list[str] | None = None, force: bool = False, push_outputs: bool = False
) -> None:
    """`dvc repro [target]`; with `set_params` (e.g. ["rl.method=grpo"]) a `dvc exp run -S ...` instead.
    `push_outputs` then pushes every output to the default DVC remote."""
    check_params(REPO / "params.yaml", parse_set_params(set_params or []))
    cmd = ["dvc", "exp", "run"] if set_params else ["dvc", "repro"]
    for s in set_params or []:
        cmd += ["-S", s]
    if force:
        cmd.append("--force")
    if target:
        cmd.append(target)
    get_run_logger().info("running: %s", " ".join(cmd))
    env = stage_env(flow_run.id or "local")
    run_dvc(cmd, env)
    _log_outputs(env["SEED_PIPELINE_RUN"])
    if push_outputs:
        push(env)


def _log_outputs(group: str) -> None:
    """The DVC outputs of this pipeline run as W&B reference artifacts (hashes from dvc.lock, nothing uploaded)."""
    lock = REPO / "dvc.lock"
    if lock.exists():
        tracker = Tracker("pipeline", {"params": check_params(REPO / "params.yaml")}, group=group)
        tracker.log_dvc_outputs(lock)
        tracker.finish()


def run(**kw) -> None:
    try:
        pipeline(**kw)
    except PipelineError as e:
        exit_with_error(e, code=1)


if __name__ == "__main__":
    ap = parser(__doc__)
    ap.add_argument("target", nargs="?", default=None, help="a dvc.yaml stage (default: the whole pipeline)")
    ap.add_argument(
        "-S", "--set-params", action="append", default=None, help="KEY=VALUE override (runs a DVC experiment)"
    )
    ap.add_argument("--force", action="store_true", help="re-run stages even if up to date")
    ap.add_argument("--push", dest="push_outputs", action="store_true", help="dvc push the outputs afterwards")
    args = ap.parse_args()
    del args.params
    main(run, args)
