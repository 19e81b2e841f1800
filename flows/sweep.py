"""Prefect flow of a methods x seeds sweep: queue one DVC experiment per combination, run the queue, collect
the results for `seed report` (all in `seed_core/tools/sweep.py`; `seed sweep` does the same without Prefect).

A failed experiment does not stop the others: the flow collects every finished one, publishes the table, and
then fails naming the failed runs.
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from _common import REPO, main, parser, publish
from seed_core.tools.sweep import report, run_sweep


class SweepError(RuntimeError):
    """Some experiments of the sweep failed (the others are collected)."""


@flow(name="seed-sweep")
def sweep(
    recipe: str = "recipes/sweeps/methods.yaml",
    seeds: int | None = None,
    methods: list[str] | None = None,
    run: bool = True,
    jobs: int = 1,
    results: str = "results",
    rerun: bool = False,
) -> list[dict]:
    log = get_run_logger()
    summary = run_sweep(
        REPO,
        recipe,
        seeds=seeds,
        methods=methods,
        run=run,
        jobs=jobs,
        results=results,
        group=f"sweep-{flow_run.id or 'local'}",
        log=log.info,
        rerun=rerun,
    )
    if summary:
        publish("sweep", f"## sweep `{recipe}`\n\nresults in `{results}/`\n\n{report(summary)}\n")
    failed = [s["name"] for s in summary if s["status"] != "success"]
    if failed:
        raise SweepError(
            f"{len(failed)} of {len(summary)} sweep runs did not succeed: {', '.join(failed)}; "
            f"the others are in {results}/ (details in {results}/sweep.json)"
        )
    return summary


if __name__ == "__main__":
    ap = parser(__doc__)
    ap.add_argument("recipe", nargs="?", default="recipes/sweeps/methods.yaml")
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--methods", nargs="+", default=None)
    ap.add_argument("--no-run", dest="run", action="store_false", help="only queue the experiments")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--results", default="results")
    args = ap.parse_args()
    del args.params
    main(sweep, args)
