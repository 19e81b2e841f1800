"""Methods x seeds comparisons as DVC experiments, and the `-S key=value` overrides they are made of.

A sweep recipe (`recipes/sweeps/methods.yaml`) names the compared methods as parameter overrides and the
seeds; `seed sweep RECIPE` expands it into one experiment per (method, seed) and
  1. validates every combination's resulting params (the same check and message as `seed params`), and that
     params.yaml already has every overridden key (`dvc exp run -S` refuses others), so a typo or an incomplete
     params file fails in a second instead of after the first run;
  2. skips those that already ran successfully on this commit with the same params (a sweep cut off, or partly
     failed, is resumed by running it again; `rerun` replaces them too); an unfinished or failed experiment of
     that name is removed first;
  3. with `--run` (one job), runs the others one after another in the workspace (params.yaml with the overrides,
     `dvc repro`, `dvc exp save -n <method>-s<seed>`): the shared stages' outputs are there already, and a run cut off resumes
     after its last complete epoch from the persisted `runs/rl`; with `--jobs J` > 1, or without `--run`, queues
     them (`dvc exp run --queue ...`) and runs the queue (`--run-all --jobs J`), each experiment in its own
     temporary copy of the repository, outputs shared through the DVC cache (a cut-off one starts again);
     a failed run does not stop the others;
  4. collects every experiment from `dvc exp show --json` (which holds the queue's success/failure state)
     and its commit (`git show <rev>:<file>`), all offline, into the results layout read by `seed report`:
       results/<method>-s<seed>/params.yaml      the experiment's params
       results/<method>-s<seed>/metrics/...      every file under metrics/ in the experiment's commit
       results/<method>-s<seed>/skills.jsonl     the last epoch's skill corpus of its RL run (DVC cache)
       results/sweep.json                        one entry per combination: status, exp name and rev, error
     and names the failed ones, with the error lines of their logs.
Experiments commit only git-visible files, so `metrics/` must not be git-ignored (DVC's convention for
`cache: false` metrics); the sweep refuses to start otherwise. This module imports neither Prefect nor DVC:
it drives the `dvc` command line.

Recipe keys: `seeds` (a count n meaning 0..n-1, or a list), `seed_keys` (every key set to the seed),
`set` (overrides shared by all runs), `methods` (name -> overrides).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from seed_core.config import ConfigError, params_from_dict
from seed_core.records import atomic_write_text, epoch_of

METRICS_DIR = "metrics"


# ---------------------------------------------------------------- overrides (`-S key=value`)


def parse_set_params(items: list[str]) -> dict[str, Any]:
    """`["rl.method=grpo", "rl.seed=1"]` -> {"rl.method": "grpo", "rl.seed": 1}; values are YAML, as for DVC."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().lstrip("+")
        if key.startswith("params.yaml:"):
            key = key[len("params.yaml:") :]
        if not sep or not key or ":" in key:
            raise ConfigError(
                f"override {item!r} must be KEY=VALUE with a dotted key into params.yaml, e.g. rl.method=grpo"
            )
        out[key] = yaml.safe_load(value) if value.strip() else ""
    return out


def apply_overrides(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of `raw` with each dotted key set (sections created as needed)."""
    out = json.loads(json.dumps(raw or {}))
    for key, value in overrides.items():
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {key}: `{p}` is not a section")
        node[leaf] = value
    return out


def check_params(params_path: str | Path, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Validate params.yaml with `overrides` applied; raises the same ConfigError as `seed params` would, or one
    naming each overridden key the file lacks (DVC refuses those: "Could not override 'rl.tis'")."""
    path = Path(params_path)
    if not path.exists():
        raise ConfigError(f"params file {path} does not exist; run from the repository root or pass --params")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"params file {path} is not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"params file {path} must be a mapping of sections, got {type(raw).__name__}")
    merged = apply_overrides(raw, overrides or {})
    params_from_dict(merged)
    # after the validation, so a misspelt key gets its "unknown key ...; allowed keys here" message first
    absent = [key for key in overrides or {} if not _has_key(raw, key)]
    if absent:
        raise ConfigError(
            f"{path} lacks {', '.join(f'`{k}`' for k in absent)}: `dvc exp run -S KEY=VALUE` sets only keys the "
            f"params file already has. Add {'it' if len(absent) == 1 else 'them'} to {path.name} (`seed params "
            "--explain` lists every key and its default), or start from a recipe, which carries every key: "
            "cp recipes/<recipe>.yaml params.yaml"
        )
    return merged


def _has_key(raw: dict[str, Any], dotted: str) -> bool:
    node: Any = raw
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def format_override(key: str, value: Any) -> str:
    """`key=value` as `dvc exp run -S` parses it back to the same value."""
    return f"{key}={value if isinstance(value, str) else json.dumps(value)}"


# ---------------------------------------------------------------- recipes


@dataclass(frozen=True)
class Combo:
    method: str
    seed: int
    overrides: dict[str, Any]

    @property
    def name(self) -> str:
        """Experiment name and results folder: `<method>-s<seed>`."""
        return f"{self.method}-s{self.seed}"


def load_recipe(path: str | Path, seeds: int | None = None, methods: list[str] | None = None) -> list[Combo]:
    """The (method, seed) combinations of a recipe, optionally cut to `seeds` seeds and some `methods`."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"sweep recipe {path} does not exist (see recipes/sweeps/)")
    r = yaml.safe_load(path.read_text()) or {}
    unknown = set(r) - {"seeds", "seed_keys", "set", "methods"}
    if unknown:
        raise ConfigError(
            f"sweep recipe {path}: unknown keys {sorted(unknown)}; allowed: methods, seeds, seed_keys, set"
        )
    all_methods = r.get("methods") or {}
    if not isinstance(all_methods, dict) or not all_methods:
        raise ConfigError(f"sweep recipe {path}: `methods` must map method names to overrides")
    chosen = methods or list(all_methods)
    missing = [m for m in chosen if m not in all_methods]
    if missing:
        raise ConfigError(f"sweep recipe {path}: unknown methods {missing}; the recipe has {list(all_methods)}")
    seed_list = r.get("seeds", 3)
    seed_list = list(range(seed_list)) if isinstance(seed_list, int) else list(seed_list)
    if seeds is not None:
        if seeds < 1:
            raise ConfigError(f"--seeds must be >= 1, got {seeds}")
        seed_list = seed_list[:seeds] if seeds <= len(seed_list) else list(range(seeds))
    seed_keys = r.get("seed_keys", ["rl.seed", "evaluate.seed"])
    common = r.get("set") or {}
    return [
        Combo(m, s, {**common, **(all_methods[m] or {}), **{k: s for k in seed_keys}})
        for m in chosen
        for s in seed_list
    ]


def check_combos(repo: Path, combos: list[Combo]) -> None:
    """Every combination's params must validate; the first error names the combination."""
    for c in combos:
        try:
            check_params(repo / "params.yaml", c.overrides)
        except ConfigError as e:
            raise ConfigError(f"sweep run {c.name}: {e}") from e


# ---------------------------------------------------------------- running DVC


def _dvc(repo: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([_dvc_exe(), *args], cwd=repo, env=env, text=True, capture_output=True)


def _dvc_exe() -> str:
    venv_dvc = Path(sys.executable).with_name("dvc")
    return str(venv_dvc) if venv_dvc.exists() else shutil.which("dvc") or "dvc"


def sweep_env(repo: Path, group: str | None = None) -> dict[str, str]:
    """Environment of the experiment runs. Queued runs execute in temporary copies of the repository, where
    the default `.alfworld/` would be missing: point $ALFWORLD_DATA at this checkout's games. This interpreter's
    bin folder goes first on PATH, as dvc.yaml's commands say `python`."""
    env = dict(os.environ, DVC_NO_ANALYTICS="1")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if "ALFWORLD_DATA" not in env and (repo / ".alfworld").is_dir():
        env["ALFWORLD_DATA"] = str((repo / ".alfworld").resolve())
    if group:
        env["SEED_PIPELINE_RUN"] = group
    return env


def check_repo(repo: Path) -> None:
    """DVC experiments need a git commit and git-visible metrics files."""
    head = subprocess.run(["git", "rev-parse", "--verify", "HEAD"], cwd=repo, capture_output=True, text=True)
    if head.returncode != 0:
        raise ConfigError(f"{repo} has no git commit; `dvc exp` needs one: git add -A && git commit")
    ignored = subprocess.run(["git", "check-ignore", "-q", f"{METRICS_DIR}/probe.json"], cwd=repo)
    if ignored.returncode == 0:
        raise ConfigError(
            f"`{METRICS_DIR}/` is git-ignored, so experiments would not keep their metrics; "
            f"remove it from .gitignore (DVC commits `cache: false` metrics to git)"
        )


def experiments(repo: Path) -> dict[str, dict]:
    """name -> {rev, state, error, log} for every experiment (run, queued or failed) of the current commit."""
    proc = _dvc(repo, "exp", "show", "--json")
    if proc.returncode != 0:
        raise RuntimeError(f"dvc exp show failed: {proc.stderr.strip()}")
    out: dict[str, dict] = {}
    for baseline in json.loads(proc.stdout or "[]"):
        for exp in baseline.get("experiments") or []:
            executor = exp.get("executor") or {}
            for rev in exp.get("revs") or []:
                if not rev.get("name"):
                    continue
                out[rev["name"]] = {
                    "rev": rev.get("rev"),
                    "state": executor.get("state") or "success",
                    "error": (rev.get("error") or {}).get("msg"),
                    "log": (executor.get("local") or {}).get("log"),
                }
    return out


def _already_ran(repo: Path, exp: dict | None, combo: Combo, params: dict) -> bool:
    """`exp` succeeded with the params `combo` would run with now (`params`, the workspace's, and its overrides)."""
    if exp is None or exp["state"] != "success" or exp["error"]:
        return False
    ran = yaml.safe_load(_git_show(repo, exp["rev"], "params.yaml") or b"null")
    return ran == apply_overrides(params, combo.overrides)


def _still_to_run(
    repo: Path, combos: list[Combo], log: Callable[[str], None], rerun: bool
) -> tuple[dict[str, Any], list[Combo]]:
    """(the workspace's params, the combinations still to run: all of them with `rerun`); an earlier experiment
    of the name of one still to run (failed, cut off, or `rerun`) is removed."""
    existing, params = experiments(repo), yaml.safe_load((repo / "params.yaml").read_text())
    done = [] if rerun else [c.name for c in combos if _already_ran(repo, existing.get(c.name), c, params)]
    if done:
        log(f"kept {len(done)} experiments already run on this commit with the same params: {', '.join(done)}")
    combos = [c for c in combos if c.name not in done]
    stale = [c.name for c in combos if c.name in existing]
    if stale:
        log(f"replacing earlier experiments: {', '.join(stale)}")
        proc = _dvc(repo, "exp", "remove", *stale)
        if proc.returncode != 0:
            raise RuntimeError(f"dvc exp remove failed: {proc.stderr.strip()}")
    return params, combos


def queue(repo: Path, combos: list[Combo], log: Callable[[str], None] = print, rerun: bool = False) -> list[Combo]:
    """Queue the combinations still to run (all of them with `rerun`); returns those queued."""
    _, combos = _still_to_run(repo, combos, log, rerun)
    for c in combos:
        args = ["exp", "run", "--queue", "-n", c.name]
        for k, v in c.overrides.items():
            args += ["-S", format_override(k, v)]
        proc = _dvc(repo, *args)
        if proc.returncode != 0:
            raise RuntimeError(f"queueing {c.name} failed: {proc.stderr.strip() or proc.stdout.strip()}")
        log(f"queued {c.name}: " + " ".join(format_override(k, v) for k, v in c.overrides.items()))
    return combos


def run_in_workspace(
    repo: Path, combos: list[Combo], env: dict[str, str], log: Callable[[str], None] = print, rerun: bool = False
) -> dict[str, Path]:
    """Run the combinations still to run one after another in the workspace: params.yaml with the run's overrides,
    `dvc repro`, then `dvc exp save -n NAME` (`dvc exp run` would first check out the workspace, deleting a cut-off
    run's checkpoints); returns {name: log file} of those that failed.

    In the workspace the persisted `runs/rl` keeps a cut-off run's checkpoints, so running the sweep again resumes
    it after its last complete epoch, and the shared stages' outputs are already there (DVC skips them). Each
    run's output is streamed and kept in `.dvc/tmp/sweep/<name>.log`. params.yaml and dvc.lock are put back as
    they were after each run; a copy kept beside the logs while a run is in flight puts them back after a kill."""
    tmp = repo / ".dvc" / "tmp" / "sweep"
    tmp.mkdir(parents=True, exist_ok=True)
    saved = {name: tmp / f"workspace-{name}" for name in ("params.yaml", "dvc.lock")}
    if saved["params.yaml"].exists():  # a sweep was cut off mid-run: its overrides are still in the workspace
        log("putting back params.yaml and dvc.lock as they were before a sweep run that was cut off")
        _restore(repo, saved)
    params, combos = _still_to_run(repo, combos, log, rerun)
    failed: dict[str, Path] = {}
    for c in combos:
        for name, copy in saved.items():  # an empty copy stands for no file
            copy.write_bytes((repo / name).read_bytes() if (repo / name).exists() else b"")
        log(f"running {c.name}: " + " ".join(format_override(k, v) for k, v in c.overrides.items()))
        log_path = tmp / f"{c.name}.log"
        try:
            atomic_write_text(
                repo / "params.yaml", yaml.safe_dump(apply_overrides(params, c.overrides), sort_keys=False)
            )
            rc = _dvc_logged(repo, log_path, env, "repro")
            if rc == 0:
                rc = _dvc_logged(repo, log_path, env, "exp", "save", "-f", "-n", c.name, "-I", METRICS_DIR, append=True)
        finally:
            _restore(repo, saved)
        if rc != 0:
            log(f"{c.name} failed (exit code {rc}); its log: {log_path}")
            failed[c.name] = log_path
    return failed


def _restore(repo: Path, saved: dict[str, Path]) -> None:
    for name, copy in saved.items():
        if copy.exists() and copy.stat().st_size:
            os.replace(copy, repo / name)
        elif copy.exists():  # there was none
            (repo / name).unlink(missing_ok=True)
            copy.unlink()


def _dvc_logged(repo: Path, log_path: Path, env: dict[str, str], *args: str, append: bool = False) -> int:
    """A dvc command whose output goes both to this process's stdout and to `log_path`; its exit code."""
    with open(log_path, "a" if append else "w") as f:
        proc = subprocess.Popen(
            [_dvc_exe(), *args], cwd=repo, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        for line in proc.stdout:
            sys.stdout.write(line)
            f.write(line)
        return proc.wait()


def run_queue(repo: Path, jobs: int = 1, env: dict[str, str] | None = None) -> int:
    """`dvc exp run --run-all`: every queued experiment; its output is relayed to this process's stdout.

    Relayed through a file, never by handing over our stdout: `dvc exp run` forks a process per queue worker that keeps
    its stdout open for as long as the worker lives, and a worker can hang while shutting down (CI: 'shutting down due
    to empty queue', then nothing), so whoever reads our output through a pipe (`seed sweep ... | tee`, a test) would
    wait for ever after the sweep itself has finished.
    """
    cmd = [_dvc_exe(), "exp", "run", "--run-all", "--jobs", str(jobs)]
    with tempfile.NamedTemporaryFile("w", prefix="seed-run-all-", suffix=".log") as out, open(out.name) as follow:
        proc = subprocess.Popen(cmd, cwd=repo, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            sys.stdout.write(follow.read())
            sys.stdout.flush()
            time.sleep(1.0)
        sys.stdout.write(follow.read())
        return proc.returncode


def _error_lines(log_path: str | None, limit: int = 5) -> list[str]:
    """The `error:` lines of a stage (our CLI's format) and DVC's `ERROR:` lines from an experiment's log."""
    if not log_path or not Path(log_path).exists():
        return []
    lines = Path(log_path).read_text(errors="replace").splitlines()
    errors = [ln.strip() for ln in lines if ln.lstrip().lower().startswith("error")]
    return list(dict.fromkeys(errors))[-limit:]


def collect(repo: Path, combos: list[Combo], results: Path, failed_logs: dict[str, Path] | None = None) -> list[dict]:
    """Write each finished experiment's params and metrics files under `results/<name>/`; return the summary.
    `failed_logs`: the logs of workspace runs that failed (they leave no experiment behind)."""
    exps = experiments(repo)
    summary = []
    for c in combos:
        e = exps.get(c.name)
        entry = {"name": c.name, "method": c.method, "seed": c.seed, "overrides": c.overrides}
        if c.name in (failed_logs or {}):
            log_path = str(failed_logs[c.name])
            entry.update(status="failed", log=log_path, error="; ".join(_error_lines(log_path)) or "see its log")
        elif e is None:
            entry.update(status="missing", error="no experiment of this name for the current commit")
        elif e["state"] in ("queued", "running"):
            entry.update(status=e["state"], rev=e["rev"])
        elif e["state"] != "success" or e["error"]:
            entry.update(
                status="failed",
                rev=e["rev"],
                log=e["log"],
                error="; ".join(_error_lines(e["log"])) or e["error"] or e["state"],
            )
        else:
            entry.update(status="success", rev=e["rev"], files=_export(repo, e["rev"], results / c.name))
        summary.append(entry)
    results.mkdir(parents=True, exist_ok=True)
    (results / "sweep.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _git_show(repo: Path, rev: str, path: str) -> bytes | None:
    proc = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=repo, capture_output=True)
    return proc.stdout if proc.returncode == 0 else None


def _export(repo: Path, rev: str, dest: Path) -> list[str]:
    """params.yaml and everything under metrics/ from the experiment's commit into `dest` (replaced), and the
    last epoch's skill corpus of its RL run as `skills.jsonl` when the DVC cache holds it."""
    listed = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev, "--", METRICS_DIR],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    shutil.rmtree(dest, ignore_errors=True)
    files = ["params.yaml", *listed]
    for f in files:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        (dest / f).write_bytes(_git_show(repo, rev, f) or b"")
    skills = _last_skills(repo, rev, yaml.safe_load((dest / "params.yaml").read_text()) or {})
    if skills is not None:
        shutil.copyfile(skills, dest / "skills.jsonl")
        files.append("skills.jsonl")
    return files


def _runs_manifest(repo: Path, rev: str) -> list[dict]:
    """The files of the `runs/rl` output at `rev` ({relpath, md5} each), read from the DVC cache; [] if absent."""
    lock = yaml.safe_load(_git_show(repo, rev, "dvc.lock") or b"{}") or {}
    outs = ((lock.get("stages") or {}).get("rl") or {}).get("outs") or []
    md5 = next((o.get("md5") or "" for o in outs if o.get("path") == "runs/rl"), "")
    path = _cache_file(repo, md5)
    return json.loads(path.read_text()) if md5.endswith(".dir") and path.exists() else []


def _cache_file(repo: Path, md5: str) -> Path:
    return repo / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:]


def _last_skills(repo: Path, rev: str, params: dict) -> Path | None:
    """The cached skills.jsonl of the experiment's last epoch (`rl.epochs`) in its RL run folder. runs/rl persists
    across parameter sets, so folders already in the baseline commit are passed over when another one matches,
    and a folder may hold later epochs of a longer run with the same parameters."""
    rl = params_from_dict(params).rl
    prefix = f"{rl.method}-{rl.advantage}-s{rl.seed}-"
    found = {
        e["relpath"]: e["md5"]
        for e in _runs_manifest(repo, rev)
        if e["relpath"].startswith(prefix)
        and e["relpath"].endswith("/skills.jsonl")
        and (epoch_of(e["relpath"].split("/")[-2]) or 0) <= rl.epochs
    }
    baseline = {e["relpath"].split("/")[0] for e in _runs_manifest(repo, f"{rev}~1")}
    own = {k: v for k, v in found.items() if k.split("/")[0] not in baseline} or found
    if not own:
        return None
    path = _cache_file(repo, own[max(own)])
    return path if path.exists() else None


def report(summary: list[dict]) -> str:
    """A markdown table of the sweep (also the Prefect artifact of the sweep flow)."""
    lines = ["| run | status | detail |", "|---|---|---|"]
    for s in summary:
        detail = s.get("error") or (f"{len(s.get('files', []))} files, rev {s['rev'][:8]}" if s.get("rev") else "")
        lines.append(f"| {s['name']} | {s['status']} | {detail} |")
    return "\n".join(lines)


def run_sweep(
    repo: Path,
    recipe: str | Path,
    seeds: int | None = None,
    methods: list[str] | None = None,
    run: bool = False,
    collect_only: bool = False,
    jobs: int = 1,
    results: str | Path = "results",
    group: str | None = None,
    log: Callable[[str], None] = print,
    rerun: bool = False,
) -> list[dict]:
    """The whole sweep (see the module docstring). Without `run` it only queues, unless `collect_only`."""
    repo = Path(repo).resolve()
    combos = load_recipe(repo / recipe if not Path(recipe).is_absolute() else recipe, seeds, methods)
    results = repo / results if not Path(results).is_absolute() else Path(results)
    failed_logs: dict[str, Path] = {}
    if not collect_only:
        check_combos(repo, combos)
        check_repo(repo)
        if run and jobs == 1:
            failed_logs = run_in_workspace(repo, combos, sweep_env(repo, group), log, rerun)
        else:
            queued = queue(repo, combos, log, rerun)
            if not run:
                log("queued; run them with `dvc exp run --run-all`, then collect with `seed sweep RECIPE --collect`")
                return []
            rc = run_queue(repo, jobs, sweep_env(repo, group)) if queued else 0
            if rc != 0:
                log(f"dvc exp run --run-all exited with {rc}; collecting what finished")
    summary = collect(repo, combos, results, failed_logs)
    log(report(summary))
    return summary
