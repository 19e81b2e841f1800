"""The `eval_table` stage: the evaluated models side by side (metrics/eval.json and the markdown table).

Reads the per-model results of the `evaluate@<model>` stages for each name in `evaluate.models`; it runs no model.
"""

from __future__ import annotations

import json
from pathlib import Path

from seed_core.config import Params
from seed_core.envs import table_task_types, task_columns
from seed_core.records import DataError, atomic_write_text, write_json


def markdown_table(results: dict[str, dict[str, dict[str, dict[str, float]]]]) -> str:
    """One row per (model, split, mode): per-type success, macro and micro (labelled), invalid rate, length.
    Task-type columns are those of the environment played."""
    types = table_task_types(
        {k for splits in results.values() for modes in splits.values() for m in modes.values() for k in m}
    )
    columns = task_columns()
    head = [
        "model",
        "split",
        "mode",
        *[columns[t] for t in types],
        "macro avg",
        "micro avg",
        "invalid rate",
        "mean length",
        "runs",
    ]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, splits in results.items():
        for split, modes in splits.items():
            for mode, m in modes.items():
                cells = [model, split, mode]
                cells += [f"{100 * m[f'success/{t}']:.1f}" if f"success/{t}" in m else "–" for t in types]
                cells += [
                    f"{100 * m['success/macro']:.1f}",
                    f"{100 * m['success/micro']:.1f}",
                    f"{100 * m['invalid_rate']:.1f}",
                    f"{m['episode_length']:.1f}",
                    str(int(m["runs"])),
                ]
                rows.append("| " + " | ".join(cells) + " |")
    return (
        "Success in %, no skills in the prompt. macro avg = mean over task types (the paper's Avg); "
        "micro avg = mean over games. Sampled rows average several seeds.\n\n" + "\n".join(rows) + "\n"
    )


SPLIT_SHORT = {"valid_seen": "seen", "valid_unseen": "unseen"}


def headline(results: dict, sft_data: dict | None = None, analyzer: dict | None = None) -> dict[str, float]:
    """The numbers a reproduction compares first, under keys short enough for `dvc metrics show` to fit a terminal:
    `<split>/<model>`, each model's success (micro) on each split in the first evaluation mode (greedy by default);
    `parse/teacher`, the share of Stage-1 teacher answers that parsed; `parse/before`, `parse/after`, the analyzer's
    held-out parse rate before and after Stage 1."""
    out = {
        f"{SPLIT_SHORT.get(split, split)}/{model}": next(iter(modes.values()))["success/micro"]
        for model, splits in results.items()
        for split, modes in splits.items()
    }
    if sft_data and "sft_data/parse_rate" in sft_data:
        out["parse/teacher"] = sft_data["sft_data/parse_rate"]
    for when in ("before", "after"):
        if analyzer and f"analyzer/{when}/parse_rate" in analyzer:
            out[f"parse/{when}"] = analyzer[f"analyzer/{when}/parse_rate"]
    return out


def run_eval_table(
    params: Params,
    metrics_dir: Path,
    metrics_path: Path,
    table_path: Path,
    headline_path: Path,
    stage_metrics: dict[str, Path],
) -> dict:
    """{model: {split: {mode: metrics}}} of every model in `evaluate.models`, to `metrics_path` and `table_path`;
    the `headline` of those and of `stage_metrics` (`sft_data`, `analyzer`: their metrics files, read where they
    exist) to `headline_path`."""
    results = {}
    for name in params.evaluate.models:
        path = Path(metrics_dir) / f"{name}.json"
        if not path.is_file():
            raise DataError(f"{path} does not exist; run the evaluation of {name} (`dvc repro evaluate@{name}`)")
        results[name] = json.loads(path.read_text())
    write_json(metrics_path, results)
    atomic_write_text(table_path, markdown_table(results))
    stages = {k: json.loads(Path(p).read_text()) for k, p in stage_metrics.items() if Path(p).is_file()}
    write_json(headline_path, headline(results, **stages))
    return results
