"""Shared plumbing of the stage flows: Prefect defaults, argument parsing, clear errors.

Flows are thin: they parse paths, call one `seed_core` function, and publish a small report. All logic lives
in `seed_core`, which never imports Prefect.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml

# A flow run without a Prefect server starts a temporary local one; on 2-core machines its first start
# (database migrations) needs more than the default timeout, and analytics make SQLite lock.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO")

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from seed_core.config import ConfigError, load_params  # noqa: E402
from seed_core.models import ModelError, resolve_device  # noqa: E402
from seed_core.records import DataError, StorageError, exit_with_error  # noqa: E402
from seed_core.runtime import setup  # noqa: E402

USER_ERRORS = (ConfigError, DataError, ModelError, StorageError)


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--params", default="params.yaml", help="parameter file (default: params.yaml)")
    return p


def cli(flow, run=None, help: dict[str, str] | None = None) -> None:
    """The command line of a stage flow, built from the flow's signature: every parameter becomes `--kebab-case`
    with the flow's default (required without one), so paths are written once, in the flow. `run` (default: the
    flow) is what is called with the parsed arguments."""
    import inspect

    fn = getattr(flow, "fn", flow)
    ap = argparse.ArgumentParser(description=sys.modules[fn.__module__].__doc__)
    for name, prm in inspect.signature(fn).parameters.items():
        text = (help or {}).get(name, "parameter file" if name == "params" else "")
        if prm.default is inspect.Parameter.empty:
            ap.add_argument(f"--{name.replace('_', '-')}", required=True, help=text)
            continue
        ap.add_argument(
            f"--{name.replace('_', '-')}", default=prm.default, help=f"{text} (default: {prm.default})".strip()
        )
    main(run or flow, ap.parse_args())


def load(params_path: str):
    """Validated params, with the process set up (offline hub) before any model code runs."""
    params = load_params(params_path)
    setup(offline=params.model.offline)
    return params


def main(run, args) -> None:
    """Run a flow; a user error (bad params, missing data or model, disk full) exits 2 with its message, no
    traceback. The params file is validated first, so a bad one is refused before Prefect starts anything."""
    try:
        if "params" in vars(args):
            resolve_device(load_params(args.params).model.device)  # refuses model.device cuda where there is none
        run(**vars(args))
    except USER_ERRORS as e:
        exit_with_error(e)


def publish(key: str, markdown: str) -> None:
    """A Prefect markdown artifact on the current flow run (shown in the UI)."""
    from prefect.artifacts import create_markdown_artifact

    create_markdown_artifact(key=key, markdown=markdown)


def stage_params(stage: str) -> list[str]:
    """The params sections (or dotted keys) that dvc.yaml tracks for `stage`: what its lineage records."""
    spec = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"][stage]
    return [k for k in spec.get("do", spec).get("params", []) if isinstance(k, str)]


def record_stage(stage: str, outputs: list[str], params: str = "params.yaml", inputs: dict | None = None) -> None:
    """Write `<output>.lineage.json` next to each output (see seed_core/tools/lineage.py): code revision, time, the
    resolved values of the params dvc.yaml tracks for the stage, the Prefect flow run id, and `inputs` read from
    outside the pipeline. Called last in each stage flow, once its outputs exist."""
    from prefect.runtime import flow_run

    from seed_core.config import to_dict
    from seed_core.tools.lineage import select_params, write_lineage

    resolved = select_params(to_dict(load_params(params)), stage_params(stage))
    write_lineage(stage, outputs, resolved, inputs=inputs, flow_run_id=flow_run.id)
