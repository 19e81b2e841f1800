"""Weights & Biases logging: offline by default, online when configured, off in tests.

- Mode: `$WANDB_MODE` when set (tests use `disabled`); else `online` when `$WANDB_API_KEY` is set; else
  `offline` (runs land in `$WANDB_DIR`, default `./wandb`; upload later with `wandb sync`).
- One W&B run per stage execution (`job_type` = the stage), grouped by pipeline run: the pipeline flow sets
  `$SEED_PIPELINE_RUN` (its Prefect flow run id; a sweep sets one per sweep) for every stage it starts.
- Config = the resolved params with secrets removed: keys that name a credential (`api_key`, `token`,
  `secret`, `password`, ...; not `max_new_tokens`) are dropped, and the value of every environment variable
  that holds a credential (the one named by `teacher.api_key_env`, `WANDB_API_KEY`, `*_TOKEN`, ...) is
  replaced by `<redacted>` wherever it appears in a string. Skill tables go through the same filter.
- Metric names are stable and slash-namespaced (`rollout/success_rate`, `opd/gate_mean`, `loss/pg`); the
  same strings go to the JSON files on disk, DVC plots and W&B.
- Large files are never uploaded: `log_dvc_outputs` logs each DVC output as an artifact holding a small
  manifest (path, DVC md5 from dvc.lock, producing stage, its deps' md5s) plus a `file://` reference to the
  content-addressed DVC cache object (or the workspace path for uncached outputs) when it exists, without
  reading it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

REDACTED = "<redacted>"
SECRET_KEY = re.compile(r"(^|[_\-.])(api[_\-]?key|key|token|secret|password|passwd|credentials?|auth)$", re.I)
"""A config key naming a credential. `max_new_tokens`, `api_key_env` (a variable NAME) do not match."""
SECRET_ENV = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD)$", re.I)
"""Environment variables whose values are treated as secrets, besides the one `teacher.api_key_env` names."""

SKILL_COLUMNS = (
    "update",
    "task_type",
    "outcome",
    "parse_status",
    "skill",
    "summary",
    "rescore.delta_mean",
    "rescore.gate_mean",
    "trajectory.won",
    "trajectory.length",
    "trajectory.task",
    "game_id",
)
"""Columns of the skills table, as dotted paths into an RL skill-corpus entry (`rl.skill_corpus`)."""


def wandb_mode() -> str:
    return os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")


def secret_values(config: Mapping[str, Any] | None = None) -> list[str]:
    """Values of the environment variables that hold credentials (longest first, so nested ones redact fully)."""
    names = {k for k in os.environ if SECRET_ENV.search(k)}
    env_name = ((config or {}).get("teacher") or {}).get("api_key_env")
    if isinstance(env_name, str):
        names.add(env_name)
    values = {os.environ[n] for n in names if len(os.environ.get(n, "")) >= 4}
    return sorted(values, key=len, reverse=True)


def scrub(value: Any, secrets: Iterable[str]) -> Any:
    """`value` with credential-named keys dropped and secret values redacted inside strings, recursively."""
    secrets = list(secrets)
    if isinstance(value, Mapping):
        return {k: scrub(v, secrets) for k, v in value.items() if not SECRET_KEY.search(str(k))}
    if isinstance(value, (list, tuple)):
        return [scrub(v, secrets) for v in value]
    if isinstance(value, str):
        for s in secrets:
            value = value.replace(s, REDACTED)
    return value


def _get(d: Mapping[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(d, Mapping):
            return None
        d = d.get(part)
    return d


class Tracker:
    """One W&B run for one stage execution; every method is a no-op when W&B is disabled."""

    def __init__(
        self,
        stage: str,
        config: Mapping[str, Any],
        group: str | None = None,
        name: str | None = None,
        enabled: bool = True,
    ):
        """`enabled=False`: a no-op tracker (the RL ranks other than rank 0, whose metrics rank 0 logs)."""
        self.run = None
        self.secrets = secret_values(config)
        mode = wandb_mode()
        if mode == "disabled" or not enabled:
            return
        import wandb

        self.wandb = wandb
        group = group or os.environ.get("SEED_PIPELINE_RUN")
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "seed"),
            job_type=stage,
            group=group,
            name=name or (f"{stage}-{group}" if group else None),
            config=scrub(dict(config), self.secrets),
            mode=mode,
            reinit="finish_previous",
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.run is not None:
            self.run.log(metrics, step=step)

    def log_skills(self, corpus: list[dict], step: int, key: str = "skills/corpus") -> None:
        """An epoch's skill corpus as a `wandb.Table` (one row per skill, columns `SKILL_COLUMNS`)."""
        if self.run is None or not corpus:
            return
        rows = [[scrub(_get(entry, c), self.secrets) for c in SKILL_COLUMNS] for entry in corpus]
        self.run.log({key: self.wandb.Table(columns=list(SKILL_COLUMNS), data=rows)}, step=step)

    def log_dvc_outputs(self, lock: str | Path = "dvc.lock", stages: Iterable[str] | None = None) -> list[str]:
        """Every output of `stages` (default: all) in dvc.lock as a reference artifact; returns their names."""
        if self.run is None:
            return []
        lock = Path(lock)
        entries = dvc_outputs(lock, stages)
        names = []
        for e in entries:
            art = self.wandb.Artifact(artifact_name(e["path"]), type="dvc-output", metadata=e)
            with art.new_file("dvc.json") as f:  # tiny; its digest changes exactly when the DVC hash does
                json.dump(e, f, indent=2, sort_keys=True)
            target = _reference_target(lock.parent, e)
            if target is not None:
                art.add_reference(target.as_uri(), name="data", checksum=False)
            self.run.log_artifact(art)
            names.append(art.name)
        return names

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


def track_stage(stage: str, params: Any, metrics: Mapping[str, Any]) -> None:
    """One W&B run for a stage execution without per-step metrics: the params as config, the stage's numeric
    results (flattened with `/`) as the run summary."""
    config = dataclasses.asdict(params) if dataclasses.is_dataclass(params) else dict(params)
    tracker = Tracker(stage, config)
    if tracker.run is not None:
        tracker.run.summary.update(flat_numbers(metrics))
    tracker.finish()


def flat_numbers(d: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flat_numbers(v, key + "/"))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[key] = v
    return out


def dvc_outputs(lock: Path, stages: Iterable[str] | None = None) -> list[dict]:
    """One entry per output in dvc.lock: path, md5, size, nfiles, stage, and the stage's deps and their md5s."""
    data = yaml.safe_load(lock.read_text()) or {}
    wanted = set(stages) if stages is not None else None
    out = []
    for stage, info in (data.get("stages") or {}).items():
        if wanted is not None and stage not in wanted:
            continue
        deps = {d["path"]: d.get("md5") for d in info.get("deps", [])}
        for o in info.get("outs", []):
            out.append(
                {
                    "path": o["path"],
                    "md5": o.get("md5"),
                    "size": o.get("size"),
                    "nfiles": o.get("nfiles"),
                    "stage": stage,
                    "deps": deps,
                }
            )
    return out


def artifact_name(path: str) -> str:
    """A W&B artifact name for a DVC output path (`models/rl` -> `dvc-models-rl`)."""
    return "dvc-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", path).strip("-")


def _reference_target(root: Path, entry: dict) -> Path | None:
    """The DVC cache object of the output (content-addressed: it stays valid), else its workspace path."""
    md5 = entry.get("md5") or ""
    cached = root.resolve() / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:]
    for p in (cached, root.resolve() / entry["path"]):
        if md5 and p.exists():
            return p
    return None
