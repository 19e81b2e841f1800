"""`seed`: the command line for people (the pipeline stages themselves run as Prefect flows via dvc.yaml)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from seed_core.config import ConfigError, explain_markdown, load_params, to_dict
from seed_core.envs.alfworld.data import DataError, data_root, install
from seed_core.models import ModelError
from seed_core.records import StorageError, exit_with_error

REPO = Path(__file__).resolve().parents[2]


def cmd_data(args: argparse.Namespace) -> None:
    root = data_root(args.data_dir, REPO)
    if args.force and root.exists():
        shutil.rmtree(root)
    counts = install(root, args.archive)
    print(f"ALFWorld data ready in {root}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


def cmd_params(args: argparse.Namespace) -> None:
    if args.explain:
        print(explain_markdown(), end="")
        return
    print(json.dumps(to_dict(load_params(args.params)), indent=2))


def cmd_probe(args: argparse.Namespace) -> None:
    from seed_core.tools.probe import format_result, run_probe

    params = load_params(args.params)
    manifests = [Path(m) for m in args.manifest]
    out = Path(args.out) if args.out else None
    trajectories = Path(args.trajectories) if args.trajectories else None
    try:
        result = run_probe(
            params, Path(args.model), manifests, args.games, args.group_size, args.seed, args.bootstrap,
            args.parts, out, trajectories,
        )  # fmt: skip
    except ValueError as e:
        raise ConfigError(str(e)) from e
    print(format_result(result))
    if out is not None:
        print(f"\nwritten: {out}")


def cmd_play(args: argparse.Namespace) -> None:
    """A human plays one game in the terminal, seeing exactly the prompt the model sees."""
    import dataclasses

    from seed_core.envs import GAMES, environment
    from seed_core.turns import parse_response

    params = load_params(args.params)
    game_id = args.game_id
    if game_id.partition(":")[0] in GAMES:  # GAME:ID, a game by its own id (a Sokoban room by seed), as configured
        name, _, game_id = game_id.partition(":")
        params = dataclasses.replace(params, env=dataclasses.replace(params.env, name=name))
    elif args.data_dir:
        params = dataclasses.replace(params, data=dataclasses.replace(params.data, alfworld_data=args.data_dir))
    env = environment(params)
    if ":" in game_id:  # a manifest index like valid_seen:3
        split, _, idx = game_id.partition(":")
        game_id = env.read_manifest(REPO / "data/manifests" / f"{split}.json")[int(idx or 0)].game_id
    closed = env.closed_actions
    with env.open_pool(0) as pool:
        state = pool.reset([game_id])[0]
        history: list[tuple[str, str]] = []
        print(
            f"{env.name} game {game_id}; type an action, its number, or a full <think>/<action> response; ctrl-d quits\n"
        )
        for t in range(params.env.max_steps):
            prompt = env.step_prompt(params.env, state.task, state.observation, state.admissible_actions, history)
            print("-" * 80 + "\n" + prompt + "\n")
            for i, a in enumerate(state.admissible_actions):
                print(f"  {i:2d}. {a}")
            try:
                raw = input(f"\nstep {t + 1}> ").strip()
            except EOFError:
                print()
                return
            if raw.isdigit() and int(raw) < len(state.admissible_actions):
                raw = state.admissible_actions[int(raw)]
            response = raw if "<action>" in raw else f"<think>human</think><action>{raw}</action>"
            action, valid = parse_response(response, state.admissible_actions if closed else None)
            history.append((state.observation, action))
            state = pool.step({0: action if valid or not closed else ""})[0]
            reward = (
                state.reward
                + (params.env.win_reward if state.won else 0.0)
                - (0.0 if valid else params.env.invalid_penalty)
            )
            print(f"\n=> {state.observation}   [valid={valid} reward={reward:+.1f}]")
            if state.won:
                print(f"\nWon in {t + 1} steps.")
                return
    print(f"\nNot won within env.max_steps={params.env.max_steps} steps.")


def cmd_run(args: argparse.Namespace) -> None:
    cmd = [sys.executable, str(REPO / "flows" / "pipeline.py")] + ([args.target] if args.target else [])
    for s in args.set_params or []:
        cmd += ["-S", s]
    sys.exit(subprocess.call(cmd, cwd=REPO))


def _fail(e: Exception) -> None:
    exit_with_error(e)


def _emit(text: str, out: str | None) -> None:
    """Print `text`, or write it atomically to `out` and say where."""
    if out is None:
        sys.stdout.write(text)
        return
    from seed_core.records import atomic_write_text

    atomic_write_text(out, text)
    print(f"wrote {out}")


def cmd_lineage(args: argparse.Namespace) -> None:
    from seed_core.tools.lineage import RENDERERS, LineageError, trace

    try:
        tree = trace(args.path, args.repo)
    except LineageError as e:
        _fail(e)
    _emit(RENDERERS[args.format](tree), args.out)


def cmd_serve(args: argparse.Namespace) -> None:
    """The deployments of prefect.yaml, served from this process until interrupted (flows/deploy.py)."""
    sys.exit(subprocess.call([sys.executable, str(REPO / "flows" / "deploy.py"), "--limit", str(args.limit)], cwd=REPO))


def cmd_sweep(args: argparse.Namespace) -> None:
    from seed_core.tools.sweep import run_sweep

    summary = run_sweep(
        Path(args.repo),
        args.recipe,
        seeds=args.seeds,
        methods=args.methods,
        run=args.run,
        collect_only=args.collect,
        jobs=args.jobs,
        results=args.results,
        rerun=args.rerun,
    )
    failed = [s["name"] for s in summary if s["status"] != "success"]
    if failed:
        exit_with_error(
            f"{len(failed)} of {len(summary)} sweep runs did not succeed: {', '.join(failed)} "
            f"(the others are collected in {args.results}/)",
            code=1,
        )


def cmd_skills(args: argparse.Namespace) -> None:
    """List (`seed skills [PATH ...]`) or diff (`seed skills diff A B`) skill corpora; see seed_core/tools/corpus.py."""
    from seed_core.tools import corpus

    filters = dict(
        epochs=args.epoch or (),
        task_types=args.task_type or (),
        outcomes=args.outcome or (),
        parse_statuses=args.parse_status or (),
        runs=args.run or (),
    )
    try:
        if args.paths[:1] == ["diff"]:
            if len(args.paths) != 3:
                raise corpus.CorpusError(
                    "usage: seed skills diff A B  (A, B: epoch numbers, epoch or run folders, skills.jsonl files or globs)"
                )

            def side(spec: str) -> list[dict]:
                # a bare number is that epoch of every corpus under the default location (narrow with --run)
                if spec.isdigit():
                    return corpus.select(corpus.load(corpus.find_corpora()), **{**filters, "epochs": [int(spec)]})
                return corpus.select(corpus.load(corpus.find_corpora([spec])), **filters)

            a, b = side(args.paths[1]), side(args.paths[2])
            for name, spec, entries in (("A", args.paths[1], a), ("B", args.paths[2], b)):
                if not entries:
                    raise corpus.CorpusError(f"side {name} ({spec}) has no skills after the filters")
            d = corpus.diff(a, b, args.top)
            _emit(
                json.dumps(d, indent=2, ensure_ascii=False) + "\n"
                if args.json
                else corpus.render_diff(d, args.top, args.width),
                None,
            )
            return
        entries = corpus.select(corpus.load(corpus.find_corpora(args.paths)), **filters)
    except corpus.CorpusError as e:
        _fail(e)
    if args.sort == "delta":
        entries.sort(key=lambda x: -corpus.delta(x))
    entries = entries[: args.limit] if args.limit else entries
    _emit(
        json.dumps(entries, indent=2, ensure_ascii=False) + "\n"
        if args.json
        else corpus.render_list(entries, args.width),
        None,
    )


def cmd_report(args: argparse.Namespace) -> None:
    from seed_core.tools.report import ReportError, write_report

    try:
        out = write_report(args.runs, args.out, args.model, args.samples, baseline=args.baseline)
        print(f"wrote {out} and {Path(out).with_suffix('.json')} (its numbers)")
    except (ReportError, ValueError) as e:
        _fail(e)


def cmd_doctor(args: argparse.Namespace) -> None:
    """Run the fault-injection suite (tests marked `fault`) and print its figures."""
    import tempfile

    tests = REPO / "tests"
    if not (tests / "faultsuite.py").exists():
        _fail(f"no test suite in {tests}: `seed doctor` runs from a source checkout (git clone, then `make test` once)")
    marker = "fault" if args.full else "fault and not slow"
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "faults.json"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            marker,
            str(tests),
            *args.pytest_args,
        ]
        rc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "SEED_FAULT_REPORT": str(report)}).returncode
        if not report.exists():
            _fail(
                f"the fault suite reported nothing (pytest exit code {rc}); is pytest installed (`pip install -e .[dev]`)?"
            )
        figures = json.loads(report.read_text())
    print(json.dumps({k: figures[k] for k in ("faults_injected", "faults_survived", "outputs_lost", "secrets_leaked")}))
    ok = (
        rc == 0
        and figures["faults_injected"] == figures["faults_survived"]
        and not figures["outputs_lost"]
        and not figures["secrets_leaked"]
    )
    sys.exit(0 if ok else 1)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="seed",
        description="SEED pipeline: self-evolving on-policy distillation for agentic RL on ALFWorld. "
        "Stages run with `dvc repro` (or `seed run`); these commands set up data and let you inspect things.",
    )
    sub = ap.add_subparsers(dest="command", required=True)

    d = sub.add_parser("data", help="install and verify game data")
    dsub = d.add_subparsers(dest="dataset", required=True)
    a = dsub.add_parser(
        "alfworld",
        help="make the ALFWorld games usable (3553 train / 140 seen / 134 unseen)",
        description="Installs the games into --data-dir (default: $ALFWORLD_DATA, else .alfworld/). Online it runs "
        "`alfworld-download`; offline give an archive of the same tree with --archive or $ALFWORLD_ARCHIVE. "
        "Does nothing when a complete copy is already there.",
    )
    a.add_argument(
        "--archive", default=None, help="alfworld_data.tgz to install from (else $ALFWORLD_ARCHIVE, else download)"
    )
    a.add_argument("--data-dir", default=None, help="target folder (default: $ALFWORLD_DATA, else .alfworld/)")
    a.add_argument("--force", action="store_true", help="delete the folder first and install again")
    a.set_defaults(func=cmd_data)

    p = sub.add_parser("params", help="validate a params file and print it resolved with every default")
    p.add_argument("--params", default="params.yaml")
    p.add_argument(
        "--explain",
        action="store_true",
        help="print every parameter's type, default and meaning as a markdown table (no params file read)",
    )
    p.set_defaults(func=cmd_params)

    pl = sub.add_parser(
        "play",
        help="play a game yourself with the model's prompt (ALFWorld or Sokoban)",
        description="GAME_ID is a game id from a manifest (e.g. valid_seen/pick_and_place_simple-.../trial_...), "
        "SPLIT:INDEX into data/manifests/SPLIT.json (e.g. valid_seen:0), or GAME:ID for any game by its own id, "
        "configured as params say (e.g. sokoban:SEED, the Sokoban room of that seed).",
    )
    pl.add_argument("game_id")
    pl.add_argument("--params", default="params.yaml")
    pl.add_argument("--data-dir", default=None, help="ALFWorld data folder (default: data.alfworld_data)")
    pl.set_defaults(func=cmd_play)

    pr = sub.add_parser(
        "probe",
        help="Sokoban: does SEED's signal carry credit (AUC vs the solver's step labels), and teacher uplift",
        description="Plays --games rooms of --manifest with the model in --model (loaded as the RL stage would load "
        "it, rl.method seed). credit: --group-size episodes per room at rollout.temperature; each step labelled by the "
        "solver (optimal, wasted, fatal, lost); skills from four sources (self: the model as analyzer; oracle: the "
        "solver-backed teacher; shuffled, shuffled_oracle: another room's self or oracle skill, the controls); the "
        "AUC with which GRPO's and GiGPO's step advantages and SEED's per-step Δ (all response tokens, action "
        "tokens) and gate tell optimal moves from the others, pooled and within trajectories (GRPO is 0.5 there by construction). uplift: greedy "
        "success with no skill, then with the oracle's or the model's skill of that first episode, the solver's "
        "plan from the current state, or another room's oracle skill in the prompt. 95 % bootstrap intervals over "
        "rooms. random: the chance baseline, uniformly random moves (no model). moves: legibility, the share of "
        "optimal greedy moves on each room's start and a few states off its solver's path, against chance. Prints the tables; --out writes JSON.",
    )
    pr.add_argument("--params", default="params.yaml", help="a Sokoban params file (default: params.yaml)")
    pr.add_argument("--model", default="models/analyzer", help="checkpoint folder (default: models/analyzer)")
    pr.add_argument(
        "--manifest",
        nargs="+",
        default=["data/manifests/valid_seen.json", "data/manifests/valid_unseen.json"],
        help="manifests whose rooms are played, in order (default: both held-out panels)",
    )
    pr.add_argument("--games", type=int, default=32, help="rooms: the manifests' first N (default 32)")
    pr.add_argument("--group-size", type=int, default=4, help="credit: episodes per room (default 4)")
    pr.add_argument("--seed", type=int, default=0, help="sampling and bootstrap seed (default 0)")
    pr.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (default 1000; 0: none)")
    pr.add_argument(
        "--parts",
        nargs="+",
        choices=["random", "credit", "uplift", "moves"],
        default=["random", "credit", "uplift", "moves"],
        help="what to run (default: all; random: uniformly random moves, the chance baseline, no model; moves: "
        "the share of optimal greedy moves against chance)",
    )
    pr.add_argument("--out", default=None, help="write the result as JSON here")
    pr.add_argument(
        "--trajectories",
        default=None,
        help="credit: write the episodes here (JSONL): step labels, each skill source's text, every signal per step",
    )
    pr.set_defaults(func=cmd_probe)

    r = sub.add_parser("run", help="run the pipeline (`dvc repro` as a Prefect flow)")
    r.add_argument("target", nargs="?", default=None, help="a stage of dvc.yaml (default: all)")
    r.add_argument("-S", "--set-params", action="append", help="KEY=VALUE: run as a DVC experiment with this override")
    r.set_defaults(func=cmd_run)

    ln = sub.add_parser(
        "lineage",
        help="what produced an output: stage, params, input hashes, code revision, upstream artifacts",
        description="PATH is any pipeline output or a file inside one (models/rl, runs/rl/<run>/epoch_002, data/sft, "
        "metrics/eval.json). Reads dvc.lock (stage, cmd, params, md5 of every dependency) and the "
        "`<output>.lineage.json` file the stage wrote next to its output (code revision, time, Prefect flow run), "
        "then follows dependencies that are outputs of other stages down to prepare (base model, game manifests).",
    )
    ln.add_argument("path")
    ln.add_argument(
        "--format", choices=["text", "md", "html", "json"], default="text", help="output format (default: text)"
    )
    ln.add_argument("--out", default=None, help="write to this file instead of printing")
    ln.add_argument(
        "--repo",
        default=None,
        help="the pipeline's folder (default: the nearest one holding dvc.lock above PATH, else the working directory)",
    )
    ln.set_defaults(func=cmd_lineage)

    sk = sub.add_parser(
        "skills",
        help="list, filter and diff the RL stage's skill corpora (runs/rl/*/epoch_*/skills.jsonl)",
        description="`seed skills [PATH ...]` lists skills; PATH is a skills.jsonl, an epoch folder, a run folder or a "
        "glob (default: runs/rl/*/epoch_*/skills.jsonl). `seed skills diff A B` compares two corpora (A, B: the same "
        "kinds of PATH, or an epoch number taken from every run, narrowed with --run): how often each normalized rule "
        "(sentence; lower case, numbers -> N) recurs on each side, which rules appeared or disappeared, and the skills "
        "with the largest mean log-prob shift (rescore.delta_mean). Filters apply to both sides.",
    )
    sk.add_argument("paths", nargs="*", metavar="PATH", help="corpora to read, or: diff A B")
    sk.add_argument("--epoch", type=int, action="append", help="keep this epoch (repeatable)")
    sk.add_argument("--task-type", action="append", help="keep task types containing this text, e.g. heat (repeatable)")
    sk.add_argument("--outcome", choices=["success", "failure"], action="append", help="keep this episode outcome")
    sk.add_argument(
        "--parse-status",
        choices=["ok", "ok_after_reask", "failed", "dropped"],
        action="append",
        help="keep this analyzer parse status",
    )
    sk.add_argument("--run", action="append", help="keep run folders whose name contains this text (repeatable)")
    sk.add_argument(
        "--sort", choices=["file", "delta"], default="file", help="list order: as stored, or by mean Δ, largest first"
    )
    sk.add_argument("--limit", type=int, default=0, help="list at most this many skills (0: all)")
    sk.add_argument("--top", type=int, default=10, help="diff: rows per section (default 10; --json has all rules)")
    sk.add_argument("--width", type=int, default=120, help="clip skill text to this many characters (0: no clipping)")
    sk.add_argument("--json", action="store_true", help="print JSON instead of text")
    sk.set_defaults(func=cmd_skills)

    rp = sub.add_parser(
        "report",
        help="one self-contained HTML page comparing methods over seeds",
        description="RUN is a run folder (params.yaml, metrics/eval.json, optional metrics/rl.json, "
        "metrics/rl_updates.json, skills.jsonl), NAME=FOLDER to name it, or a folder of run folders such as the "
        "results/ of `seed sweep` (whose sweep.json lists failed runs). Folders named <method>-s<seed> are seeds "
        "of one method; each table cell is the mean over seeds ± the half-width of a 95% Student-t interval. "
        "Learning curves (with 95% bands) and OPD statistics come from the rl metrics; sample skills from the "
        "corpora. The learning-curve table's numbers are also written as JSON next to the page (OUT with .json).",
    )
    rp.add_argument("runs", nargs="+", metavar="RUN")
    rp.add_argument("--out", default="report.html", help="the page to write (default: report.html)")
    rp.add_argument("--model", default="rl", help="which model of eval.json to compare (default: rl)")
    rp.add_argument("--samples", type=int, default=3, help="sample skills per method (default: 3)")
    rp.add_argument(
        "--baseline", default="grpo", help="the method every other one is paired against, seed by seed (default: grpo)"
    )
    rp.set_defaults(func=cmd_report)

    sv = sub.add_parser(
        "serve",
        help="serve the Prefect deployments of prefect.yaml (pipeline, sweep) from one process",
        description="Runs until interrupted, executing the runs triggered from the UI, the API or a schedule. "
        "Set PREFECT_API_URL to a server's API (`prefect server start`); a work pool is not needed.",
    )
    sv.add_argument("--limit", type=int, default=1, help="flow runs executed at once (default 1)")
    sv.set_defaults(func=cmd_serve)

    sw = sub.add_parser(
        "sweep",
        help="methods x seeds as DVC experiments, collected into results/ for `seed report`",
        description="One DVC experiment <method>-s<seed> per combination of the recipe "
        "(recipes/sweeps/methods.yaml), after validating every combination's params. With --run they run one "
        "after another in this workspace (params.yaml with the overrides, `dvc repro`, `dvc exp save`), so the "
        "shared stages run once and a run cut off resumes after its last complete RL epoch; with --jobs N > 1 "
        "(or without --run) they are queued (`dvc exp run --queue`) and run in temporary copies. Each experiment's "
        "params.yaml and metrics/ are collected into RESULTS/<method>-s<seed>/ plus RESULTS/sweep.json; a failed "
        "run does not stop the others and is named at the end (exit code 1). Running the same sweep again resumes "
        "it: experiments that already succeeded on this commit with the same params are kept.",
    )
    sw.add_argument("recipe", help="a sweep recipe, e.g. recipes/sweeps/methods.yaml")
    sw.add_argument(
        "--seeds", type=int, default=None, help="use the first N seeds of the recipe (0..N-1 if it has fewer)"
    )
    sw.add_argument("--methods", nargs="+", default=None, help="only these methods of the recipe")
    sw.add_argument(
        "--run", action="store_true", help="run the experiments (in this workspace; queued with --jobs > 1) and collect"
    )
    sw.add_argument("--collect", action="store_true", help="only collect the results of experiments already run")
    sw.add_argument(
        "--rerun", action="store_true", help="run every combination again, also those that already succeeded"
    )
    sw.add_argument(
        "--jobs", type=int, default=1, help="experiments run at once (default 1: in the workspace, resumable)"
    )
    sw.add_argument("--results", default="results", help="results folder (default: results/)")
    sw.add_argument("--repo", default=".", help="the DVC repository (default: the current directory)")
    sw.set_defaults(func=cmd_sweep)

    dr = sub.add_parser(
        "doctor",
        help="inject every fault of the reliability suite for real and print the figures",
        description="Runs the tests marked `fault` (pytest, from this source checkout): kill -9 of `dvc repro` in each "
        "stage, teacher endpoint faults, bad parameters, bad data, bad model output, NaN updates, a full or read-only "
        "disk, and a scan of every file a run writes for a planted API key. Prints one JSON line: faults injected, "
        "survived, outputs lost (must be 0), secrets leaked (must be 0); exit code 1 unless all survived. Without "
        "--full the slow pipeline-level faults (the kill -9 chain) are left out.",
    )
    dr.add_argument("--full", action="store_true", help="include the slow faults (several `dvc repro` runs; minutes)")
    dr.add_argument("pytest_args", nargs="*", help="extra pytest arguments, after --, e.g. -- -x")
    dr.set_defaults(func=cmd_doctor)
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ConfigError, DataError, ModelError, StorageError) as e:
        exit_with_error(e)


if __name__ == "__main__":
    main()
