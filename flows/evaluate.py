"""Prefect flow of the `evaluate` stage: success per task type on seen and unseen games, no skills."""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger

from _common import cli, load, publish, record_stage
from seed_core.stages.evaluate import run_evaluate
from seed_core.tracking import track_stage


@flow(name="evaluate")
def evaluate(
    params: str = "params.yaml",
    model: list[str] | None = None,
    manifest_dir: str = "data/manifests",
    metrics: str = "metrics/eval.json",
    table: str = "metrics/eval.md",
    trajectories: str = "data/eval",
) -> dict:
    p = load(params)
    models = []
    for spec in model or [f"{name}=models/{name}" for name in p.evaluate.models]:
        name, sep, path = spec.partition("=")
        if not sep:
            raise ValueError(f"--model takes NAME=PATH, got {spec!r}")
        models.append((name, Path(path)))
    results = run_evaluate(p, models, Path(manifest_dir), Path(metrics), Path(table), Path(trajectories))
    text = Path(table).read_text()
    get_run_logger().info("\n%s", text)
    publish("evaluate", "## evaluate\n\n" + text)
    record_stage("evaluate", [trajectories, table, metrics], params)
    track_stage("evaluate", p, results)
    return results


if __name__ == "__main__":
    cli(
        evaluate,
        help={
            "model": "NAME=PATH of a model to evaluate (repeatable; default: models/<name> for each of evaluate.models)"
        },
    )
