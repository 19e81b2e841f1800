"""Prefect flow of the `prepare` stage: verify the games, materialize models/base, write the manifests."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import flow, get_run_logger

from _common import cli, load, publish, record_stage
from seed_core.envs import environment
from seed_core.stages.prepare import check_model_source, run_prepare
from seed_core.tracking import track_stage


@flow(name="prepare")
def prepare(params: str = "params.yaml", model_dir: str = "models/base", manifest_dir: str = "data/manifests") -> dict:
    p = load(params)
    counts = run_prepare(p, Path(model_dir), Path(manifest_dir))
    get_run_logger().info("manifests written: %s", counts)
    publish("prepare", "## prepare\n\nGames per manifest:\n```\n" + json.dumps(counts, indent=2) + "\n```")
    record_stage(
        "prepare",
        [model_dir, manifest_dir],
        params,
        inputs={**environment(p).source(), "base_model": p.model.name_or_path},
    )
    track_stage("prepare", p, counts)
    return counts


def run(**kw) -> None:
    # Refused before the flow starts: a model path that does not exist is a user error, not a crash.
    check_model_source(load(kw["params"]).model.name_or_path)
    prepare(**kw)


if __name__ == "__main__":
    cli(prepare, run)
