"""One rank of a distributed run (`rl.launcher: torchrun` or `ray`): `python -m seed_core.stages.rl`."""

from __future__ import annotations

import argparse
from pathlib import Path

from seed_core import distributed
from seed_core.config import load_params
from seed_core.runtime import setup
from seed_core.stages.rl.identity import INIT, PATHS, run_folder_name
from seed_core.stages.rl.loop import RLRun


def main(argv: list[str] | None = None) -> None:
    """One rank of `rl.launcher: torchrun`: every pending epoch, in step with the other ranks."""
    ap = argparse.ArgumentParser(
        description=main.__doc__
        + " Start it under torchrun: the rl stage does (see seed_core.launch); for several nodes, run torchrun on each (README)."
    )
    ap.add_argument("--params", type=Path, default=Path(PATHS.params))
    ap.add_argument("--init", type=Path, help="the checkpoint RL starts from (default: the one rl.init names)")
    ap.add_argument("--manifest-dir", type=Path, default=Path(PATHS.manifest_dir))
    ap.add_argument(
        "--run-dir", type=Path, help=f"the run folder (default: {PATHS.runs_dir}/<the run folder of these params>)"
    )
    args = ap.parse_args(argv)
    params = load_params(args.params)
    setup(offline=params.model.offline)
    init = args.init or Path(INIT[params.rl.init])
    run_dir = args.run_dir or Path(PATHS.runs_dir) / run_folder_name(params, init)
    owned = distributed.init()
    try:
        run = RLRun(params, init, args.manifest_dir, run_dir)
        for epoch in run.pending():
            run.run_epoch(epoch)
        run.close()
    finally:
        if owned:
            distributed.close()
