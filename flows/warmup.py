"""Prefect flow of the `warmup` stage: perception SFT (vision models) and behaviour-cloning SFT on expert steps (tiny models only)."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import flow, get_run_logger

from _common import cli, load, publish, record_stage
from seed_core.stages.warmup import run_warmup
from seed_core.tracking import track_stage


@flow(name="warmup")
def warmup(
    params: str = "params.yaml",
    manifest: str = "data/manifests/warmup.json",
    base_model: str = "models/base",
    out_dir: str = "models/warmup",
    metrics: str = "metrics/warmup.json",
    perception_dir: str = "models/perception",
) -> dict:
    p = load(params)
    result = run_warmup(p, Path(manifest), Path(base_model), Path(out_dir), Path(metrics), Path(perception_dir))
    get_run_logger().info("warm-up: %s", result)
    publish("warmup", "## warmup\n\n```\n" + json.dumps(result, indent=2, default=str) + "\n```")
    record_stage("warmup", [out_dir, perception_dir, metrics], params)
    track_stage("warmup", p, result)
    return result


if __name__ == "__main__":
    cli(warmup)
