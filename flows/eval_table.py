"""Prefect flow of the `eval_table` stage: the evaluated models side by side (metrics/eval.json, metrics/eval.md),
and the headline numbers a reproduction compares (metrics/headline.json, what `dvc metrics show` prints)."""

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
    headline: str = "metrics/headline.json",
    sft_data: str = "metrics/sft_data.json",
    analyzer: str = "metrics/train_analyzer.json",
) -> dict:
    p = load(params)
    stage_metrics = {"sft_data": Path(sft_data), "analyzer": Path(analyzer)}
    results = run_eval_table(p, Path(metrics_dir), Path(metrics), Path(table), Path(headline), stage_metrics)
    text = Path(table).read_text()
    get_run_logger().info("\n%s", text)
    publish("evaluate", "## evaluate\n\n" + text)
    record_stage("eval_table", [table, metrics, headline], params)
    track_stage("evaluate", p, results)
    return results


if __name__ == "__main__":
    cli(eval_table)
