"""Prefect flow of an `evaluate@<model>` stage: one model's success per task type on seen and unseen games, no
skills in the prompt (dvc.yaml runs it once per name in evaluate.models; `eval_table` puts them side by side)."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import flow, get_run_logger

from _common import cli, load, publish, record_stage
from seed_core.stages.evaluate import run_evaluate
from seed_core.tracking import track_stage


@flow(name="evaluate", flow_run_name="evaluate-{model}")
def evaluate(
    model: str,
    params: str = "params.yaml",
    model_dir: str = "models/{model}",
    manifest_dir: str = "data/manifests",
    metrics_dir: str = "metrics/eval",
    trajectories: str = "data/eval",
) -> dict:
    p = load(params)
    metrics = Path(metrics_dir) / f"{model}.json"
    results = run_evaluate(
        p, model, Path(model_dir.format(model=model)), Path(manifest_dir), metrics, Path(trajectories)
    )
    get_run_logger().info("%s: %s", model, json.dumps(results))
    publish(f"evaluate-{model}", f"## evaluate {model}\n\n```\n{json.dumps(results, indent=2)}\n```")
    record_stage("evaluate", [str(Path(trajectories) / model), str(metrics)], params, inputs={"model": model})
    track_stage(f"evaluate/{model}", p, results)
    return results


if __name__ == "__main__":
    cli(evaluate, help={"model": "name of the model (base, warmup, rl, or any name with --model-dir)"})
