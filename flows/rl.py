"""Prefect flow of the `rl` stage: SEED (or a baseline) for rl.epochs epochs, one task run per epoch.

Each parameter set trains in its own folder under --runs-dir (named by a hash of the parameters that shape
the run), so a killed `dvc repro` resumes after the last complete epoch, and `dvc exp run -S rl.method=...`
starts a fresh run instead of clobbering another one. With `rl.launcher: torchrun` the flow starts
`rl.world_size` rank processes, streams their log, and records one task run per epoch as each epoch folder
appears; the ranks never import Prefect.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from _common import cli, load, publish, record_stage
from seed_core.stages.rl import INIT, PATHS, run_folder_name, train, write_outputs


@task(name="rl-epoch", cache_policy=NO_CACHE)
def epoch_task(train_it) -> dict:
    return train_it()


@flow(name="rl")
def rl(
    params: str = PATHS.params,
    manifest_dir: str = PATHS.manifest_dir,
    runs_dir: str = PATHS.runs_dir,
    out_dir: str = PATHS.out_dir,
    metrics: str = PATHS.metrics,
    plots: str = PATHS.plots,
) -> dict:
    p = load(params)
    log = get_run_logger()
    init = Path(INIT[p.rl.init])
    run_dir = Path(runs_dir) / run_folder_name(p, init)
    log.info(
        "method %s, advantage %s, start %s, run folder %s, launcher %s x %d",
        p.rl.method,
        p.rl.advantage,
        init,
        run_dir,
        p.rl.launcher,
        p.rl.world_size,
    )
    for epoch, train_it in train(p, Path(params), init, Path(manifest_dir), run_dir, log=log.info):
        epoch_task.with_options(task_run_name=f"epoch-{epoch}")(train_it)
    summary = write_outputs(p, init, run_dir, Path(out_dir), Path(metrics), Path(plots))
    rows = "\n".join(f"| {k} | {v:.4g} |" for k, v in summary["mean_over_updates"].items())
    publish(
        "rl",
        f"## rl ({p.rl.method}, {p.rl.advantage})\n\nrun folder `{run_dir}`\n\n| metric (mean over updates) | value |\n|---|---|\n{rows}\n",
    )
    record_stage("rl", [runs_dir, out_dir, plots, metrics], params, inputs={"run_dir": str(run_dir)})
    return summary


if __name__ == "__main__":
    cli(rl)
