"""Prefect flow of the `eval_table` stage: the evaluated models side by side (metrics/eval.json, metrics/eval.md)."""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger

from _common import cli, load, publish, record_stage
from seed_core.stages.eval_table import run_eval_table
from seed_core.tracking import track_stage


@flow(name="eval_table")
def eval_table(
    params: str = "params.yaml",
    metrics_dir: str = "metrics/eval",
    metrics: str = "metrics/eval.json",
    table: str = "metrics/eval.md",
) -> dict:
    p = load(params)
    results = run_eval_table(p, Path(metrics_dir), Path(metrics), Path(table))
    text = Path(table).read_text()
    get_run_logger().info("\n%s", text)
    publish("evaluate", "## evaluate\n\n" + text)
    record_stage("eval_table", [table, metrics], params)
    track_stage("evaluate", p, results)
    return results


if __name__ == "__main__":
    cli(eval_table)
