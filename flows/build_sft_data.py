"""Prefect flow of the `build_sft_data` stage: roll out the starting policy, label every trajectory with the
teacher's hindsight skill, write the analyzer SFT set (train / validation by game)."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import flow, get_run_logger

from _common import cli, load, publish, record_stage
from seed_core.method.teachers import MissingAPIKeyError
from seed_core.records import exit_with_error
from seed_core.stages.build_sft_data import check_teacher_key, preview_records, run_build_sft_data
from seed_core.tracking import track_stage

SAMPLES = 3
"""Sample skills shown in the flow's report."""


def report(metrics: dict, samples: list[dict]) -> str:
    lines = ["## build_sft_data", "", "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {round(v, 4) if isinstance(v, float) else v} |" for k, v in metrics.items()]
    lines += ["", f"### Sample skills ({min(SAMPLES, len(samples))} of {len(samples)})", ""]
    for s in samples[:SAMPLES]:
        lines += [
            f"**{s['task_type']}**, {s['outcome']} ({s['split']}): {s['task']}",
            "",
            f"> {s['episode_skill']}",
            "",
        ]
    return "\n".join(lines)


@flow(name="build_sft_data")
def build_sft_data(
    params: str = "params.yaml",
    manifest: str = "data/manifests/train.json",
    model: str = "models/warmup",
    out_dir: str = "data/sft",
    metrics: str = "metrics/sft_data.json",
) -> dict:
    p = load(params)
    result = run_build_sft_data(p, Path(manifest), Path(model), Path(out_dir), Path(metrics))
    get_run_logger().info("SFT data: %s", json.dumps(result))
    publish("build-sft-data", report(result, preview_records(out_dir)))
    record_stage("build_sft_data", [out_dir, metrics], params)
    track_stage("build_sft_data", p, result)
    return result


def run(**kw) -> None:
    try:
        # Refused before the flow (and any rollout) starts: a missing key is a user error, not a crash.
        check_teacher_key(load(kw["params"]).teacher)
    except MissingAPIKeyError as e:
        exit_with_error(e)
    build_sft_data(**kw)


if __name__ == "__main__":
    cli(build_sft_data, run, help={"model": "the policy rolled out (the warmed-up or base model)"})
