"""Prefect flow of the `train_analyzer` stage: SFT of the starting policy into the analyzer (analyzer prompt ->
skill JSON), and its held-out parse rate and skill quality before versus after."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import flow, get_run_logger

from _common import cli, load, publish, record_stage
from seed_core.stages.train_analyzer import run_train_analyzer
from seed_core.tracking import track_stage

SAMPLES = 3
"""Held-out trajectories whose skills are shown in the flow's report."""


def report(metrics: dict, heldout: list[dict]) -> str:
    lines = [
        "## train_analyzer",
        "",
        "Held-out trajectories, analyzer before SFT (starting model) vs after:",
        "",
        "| metric | before | after |",
        "|---|---|---|",
    ]
    for k in ("parse_rate", "skill_token_f1", "target_location_hit", "skill_chars_mean"):
        b, a = metrics.get(f"analyzer/before/{k}"), metrics.get(f"analyzer/after/{k}")
        lines.append(f"| {k} | {'–' if b is None else round(b, 3)} | {'–' if a is None else round(a, 3)} |")
    lines += ["", "| metric | value |", "|---|---|"]
    lines += [
        f"| {k} | {round(v, 4) if isinstance(v, float) else v} |"
        for k, v in metrics.items()
        if not k.startswith(("analyzer/before/", "analyzer/after/"))
    ]
    lines += ["", f"### Sample held-out skills ({min(SAMPLES, len(heldout))} of {len(heldout)})", ""]
    for h in heldout[:SAMPLES]:
        lines += [
            f"**{h['task_type']}**, {h['outcome']} (`{h['traj_id']}`)",
            "",
            f"- teacher: {h['teacher_skill']}",
            f"- before ({h['before_status']}): {h['before_skill'] or repr(h['before_raw'][:200])}",
            f"- after ({h['after_status']}): {h['after_skill'] or repr(h['after_raw'][:200])}",
            "",
        ]
    return "\n".join(lines)


@flow(name="train_analyzer")
def train_analyzer(
    params: str = "params.yaml",
    sft_data: str = "data/sft",
    start_model: str = "models/warmup",
    out_dir: str = "models/analyzer",
    metrics: str = "metrics/train_analyzer.json",
    heldout: str = "metrics/train_analyzer_heldout.jsonl",
) -> dict:
    p = load(params)
    result = run_train_analyzer(p, Path(sft_data), Path(start_model), Path(out_dir), Path(metrics), Path(heldout))
    get_run_logger().info("analyzer: %s", json.dumps(result))
    rows = [json.loads(line) for line in Path(heldout).read_text(encoding="utf-8").splitlines() if line.strip()]
    publish("train-analyzer", report(result, rows))
    record_stage("train_analyzer", [out_dir, metrics, heldout], params)
    track_stage("train_analyzer", p, result)
    return result


if __name__ == "__main__":
    cli(train_analyzer, help={"start_model": "the model fine-tuned (and measured before SFT)"})
