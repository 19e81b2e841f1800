"""Serve every deployment of prefect.yaml from this one process (`seed serve`); no work pool needed.

prefect.yaml is the single definition: `prefect deploy --all` registers the same deployments with a work
pool (README, "GPU machine"), and this script serves them with `prefect.serve`, which polls the server
(`$PREFECT_API_URL`) for their runs and executes each in a subprocess of this checkout. Schedules written
in prefect.yaml (`cron` or `interval` entries) are served too.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
from pathlib import Path

import yaml
from prefect import serve
from prefect.schedules import Cron, Interval

from _common import REPO


def _schedule(spec: dict):
    opts = {k: spec[k] for k in ("timezone", "active", "parameters") if k in spec}
    if "cron" in spec:
        return Cron(spec["cron"], **opts)
    if "interval" in spec:
        return Interval(datetime.timedelta(seconds=spec["interval"]), **opts)
    raise ValueError(f"prefect.yaml: a schedule needs `cron` or `interval`, got {sorted(spec)}")


def deployments(spec: Path = REPO / "prefect.yaml") -> list:
    """RunnerDeployments for every entry of prefect.yaml (entrypoints are `flows/<file>.py:<flow function>`)."""
    out = []
    for d in yaml.safe_load(spec.read_text())["deployments"]:
        path, _, func = d["entrypoint"].partition(":")
        fl = getattr(importlib.import_module(Path(path).stem), func)
        out.append(
            fl.to_deployment(
                name=d["name"],
                description=d.get("description"),
                tags=d.get("tags"),
                parameters=d.get("parameters") or {},
                schedules=[_schedule(s) for s in d.get("schedules") or []],
            )
        )
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--limit", type=int, default=1, help="flow runs executed at once (default 1: runs share the repo)")
    args = ap.parse_args()
    serve(*deployments(), limit=args.limit)
