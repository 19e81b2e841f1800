"""Artifact lineage: which stage produced an output, from which inputs, under which parameters and code.

Two sources, joined by output path:
- `dvc.lock` (authoritative, versioned with the code): each stage's command, its parameter values, and the md5
  of every dependency and output.
- a small metadata file each stage writes next to each of its outputs, `<output>.lineage.json` (for example
  `models/base.lineage.json`, `metrics/eval.json.lineage.json`): what DVC does not record, i.e. the code
  revision (`git rev-parse HEAD` plus the files that differed from it), the time, the resolved parameter
  values (defaults included), the Prefect flow run id, the DVC experiment name and baseline commit when run
  by `dvc exp run`, external inputs (the ALFWorld data root, the base model id), and the machine (CPU and its
  bf16 flags, torch threads, GPU, library versions: what can change floats under the same code).

Why a sibling and not a file inside the output folder: the metadata holds a time stamp and a commit id, so
inside the folder it would change the folder's DVC hash on every run; every downstream stage would then
re-run even when the stage reproduced byte-identical outputs, which is the whole point of DVC's caching.
The price: `dvc pull`/`dvc checkout`/`dvc exp apply` restore outputs without their metadata; `trace` then says
so and falls back to the commit that last changed `dvc.lock`.

`trace(path)` maps a path to the output that contains it (a file inside `runs/rl/<run>/epoch_002/` maps to
the `runs/rl` output), then follows dependencies that are outputs of other stages, recursively, down to the
stages with no upstream (prepare: the base model and the task manifests, whose per-game sha256 it digests).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import html
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from seed_core.records import write_json

SUFFIX = ".lineage.json"
_BOOKKEEPING = (":(exclude,glob)**/dvc.lock", ":(exclude,glob)**/.gitignore", f":(exclude,glob)**/*{SUFFIX}")
"""git pathspecs of files DVC and the stages rewrite during `dvc repro` (not a sign the code differs from HEAD)."""


class LineageError(ValueError):
    """A path no stage produced, or a repository without a pipeline record; the message says what exists."""


# ------------------------------------------------------------------------------------------------ writing


def metadata_path(output: str | os.PathLike) -> Path:
    """`<output>.lineage.json`, next to the output (a file or a folder)."""
    return Path(str(output).rstrip("/") + SUFFIX)


def git_revision(cwd: str | os.PathLike = ".") -> dict[str, Any]:
    """{"commit": HEAD or None, "dirty": bool, "changed": tracked files under `cwd` that differ from HEAD (first 50)}.

    Untracked files, dvc.lock, .gitignore files, lineage files and the pipeline's own outputs (as dvc.yaml and
    dvc.lock in `cwd` list them) are not counted: DVC and the stages write them during `dvc repro`, so
    counting them would mark every stage after the first as dirty."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True)
        if head.returncode != 0:
            return {"commit": None, "dirty": None, "changed": [], "note": head.stderr.strip() or "not a git repository"}
        diff = subprocess.run(
            ["git", "diff", "HEAD", "--name-only", "--relative", "--", ".", *_BOOKKEEPING],
            cwd=cwd,
            capture_output=True,
            text=True,
        )
    except FileNotFoundError:
        return {"commit": None, "dirty": None, "changed": [], "note": "git is not installed"}
    outs = _pipeline_outputs(Path(cwd))
    changed = [f for f in diff.stdout.splitlines() if f.strip() and not any(_inside(f, o) for o in outs)]
    return {"commit": head.stdout.strip(), "dirty": bool(changed), "changed": changed[:50]}


# Libraries whose kernels or defaults shape a stage's numbers; the CPU flags that, with the vendor, pick
# `model.dtype: auto`'s dtype (`models.cpu_bf16_faster`, recorded as cpu_auto_dtype) and the widest vector units
# (float summation order follows them).
_VERSIONED = ("torch", "transformers", "peft", "trl", "accelerate", "vllm", "alfworld", "textworld", "dvc", "prefect")
_CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


def machine_facts() -> dict[str, Any]:
    """What can change a stage's floats under the same code and parameters: the CPU, its bf16 support, torch's
    threads, the GPU and the library versions (README, "Did I get what you got?")."""
    import platform
    from importlib import metadata

    import torch

    from seed_core.models import cpu_facts, pick_dtype

    cpu, _, flags = cpu_facts()
    versions = {}
    for name in _VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "cpu_flags": [f for f in _CPU_FLAGS if f in flags],
        "cpu_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
        "cpu_auto_dtype": str(pick_dtype("auto", "cpu")).removeprefix("torch."),
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "versions": versions,
    }


def _pipeline_outputs(root: Path) -> set[str]:
    outs = {o for v in _declared_outputs(root).values() for o in v}
    try:
        stages = (yaml.safe_load((root / "dvc.lock").read_text()) or {}).get("stages") or {}
    except (OSError, yaml.YAMLError):
        stages = {}
    return outs | {o["path"] for e in stages.values() for o in e.get("outs") or []}


def select_params(resolved: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """{key: value} for params.yaml sections or dotted keys (`"rl"`, `"model.dtype"`), as dvc.yaml lists them."""
    out = {}
    for key in keys:
        node: Any = resolved
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                raise LineageError(
                    f"parameter {key!r} is not in the resolved parameters (sections: {sorted(resolved)})"
                )
            node = node[part]
        out[key] = node
    return out


def write_lineage(
    stage: str,
    outputs: list[str],
    params: dict[str, Any],
    *,
    inputs: dict[str, Any] | None = None,
    flow_run_id: str | None = None,
    cwd: str | os.PathLike = ".",
) -> list[Path]:
    """Write `<output>.lineage.json` next to every existing output of a finished stage; returns the files written.

    `params`: the stage's resolved parameter values ({section or dotted key: value}); `inputs`: what the stage
    read from outside the pipeline (data root, model id)."""
    record = {
        "stage": stage,
        "outputs": [str(o) for o in outputs],
        "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "git": git_revision(cwd),
        "params": params,
        "inputs": inputs or {},
        "prefect_flow_run_id": flow_run_id,
        "machine": machine_facts(),
    }
    if os.environ.get("DVC_EXP_BASELINE_REV"):
        # inside `dvc exp run`, HEAD can be DVC's temporary commit; DVC names the experiment and its baseline
        record["dvc_experiment"] = {
            "name": os.environ.get("DVC_EXP_NAME"),
            "baseline_rev": os.environ["DVC_EXP_BASELINE_REV"],
        }
    written = []
    for out in outputs:
        if not Path(cwd, out).exists():  # a missing output is DVC's to report; bookkeeping never fails a stage
            continue
        path = Path(cwd) / metadata_path(out)
        write_json(path, record)
        written.append(path)
    return written


# ------------------------------------------------------------------------------------------------ reading


def find_root(path: str | os.PathLike) -> Path:
    """The nearest folder at or above `path` (else the working directory) holding dvc.yaml or dvc.lock."""
    start, cwd = Path(os.path.abspath(path)), Path(os.path.abspath("."))
    for d in [start, *start.parents, cwd, *cwd.parents]:
        if (d / "dvc.lock").exists() or (d / "dvc.yaml").exists():
            return d
    raise LineageError(
        f"no dvc.yaml or dvc.lock at or above {path} nor in the working directory; run inside the pipeline's repository or pass --repo"
    )


def _inside(path: str, out: str) -> bool:
    return path == out or path.startswith(out.rstrip("/") + "/")


def _rel(path: str | os.PathLike, root: Path) -> str:
    # abspath, not resolve: DVC may link outputs into its cache with symlinks, which resolve() would follow.
    # A relative path is taken from the working directory, else (when it is not there) from the repository.
    p = Path(os.path.abspath(path))
    if not os.path.isabs(path) and not p.exists():
        p = Path(os.path.abspath(os.path.join(root, path)))
    try:
        return p.relative_to(os.path.abspath(root)).as_posix()
    except ValueError as e:
        raise LineageError(f"{path} is outside the pipeline's repository {root}") from e


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict) or not d:
        return {prefix.rstrip("."): d} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}."))
    return out


def _lock_params(entry: dict) -> dict[str, Any]:
    """dvc.lock params as flat dotted keys; keys from a file other than params.yaml are prefixed `file:`."""
    out = {}
    for file, values in (entry.get("params") or {}).items():
        for k, v in _flat(values).items():
            out[k if file == "params.yaml" else f"{file}:{k}"] = v
    return out


def _hash(item: dict) -> str:
    return str(item.get("md5") or item.get("etag") or item.get("checksum") or "?")


def _declared_outputs(root: Path) -> dict[str, list[str]]:
    """Outputs declared in dvc.yaml per stage (plain stages only; templated ones are listed by dvc.lock)."""
    try:
        stages = (yaml.safe_load((root / "dvc.yaml").read_text()) or {}).get("stages") or {}
    except (OSError, yaml.YAMLError):
        return {}
    out: dict[str, list[str]] = {}
    for name, st in stages.items():
        if isinstance(st, dict):
            for kind in ("outs", "metrics", "plots"):
                for o in st.get(kind) or []:
                    out.setdefault(name, []).append(next(iter(o)) if isinstance(o, dict) else str(o))
    return out


def _manifest_summary(path: Path) -> list[dict]:
    """Task manifests ({"games": [{game_id, split, sha256}, ...]}) at `path` (a file or a folder of them):
    games per manifest and one digest of their game-file hashes, which pins the ALFWorld data actually used."""
    files = (
        sorted(path.glob("*.json")) if path.is_dir() else [path] if path.suffix == ".json" and path.is_file() else []
    )
    out = []
    for f in files:
        try:
            games = json.loads(f.read_text()).get("games")
        except (OSError, json.JSONDecodeError, AttributeError):
            continue
        if not isinstance(games, list) or not all(isinstance(g, dict) and "sha256" in g for g in games):
            continue
        digest = hashlib.sha256("".join(f"{g.get('game_id')}:{g['sha256']}\n" for g in games).encode()).hexdigest()
        out.append(
            {
                "manifest": f.name,
                "games": len(games),
                "splits": sorted({str(g.get("split")) for g in games}),
                "games_sha256": digest,
            }
        )
    return out


def _lock_commit(root: Path) -> str | None:
    """The last commit that changed dvc.lock: the best stand-in for a missing metadata file's code revision."""
    try:
        r = subprocess.run(
            ["git", "log", "-1", "--format=%H", "--", "dvc.lock"], cwd=root, capture_output=True, text=True
        )
    except FileNotFoundError:
        return None
    return (r.stdout.strip() or None) if r.returncode == 0 else None


class _Lock:
    def __init__(self, root: Path):
        self.root = root
        lock = root / "dvc.lock"
        if not lock.exists():
            raise LineageError(f"{lock} does not exist: no stage has run yet in {root} (`dvc repro`)")
        self.stages: dict[str, dict] = (yaml.safe_load(lock.read_text()) or {}).get("stages") or {}

    def producer(self, rel: str) -> tuple[str, str] | None:
        """(stage, output) whose output is `rel` or contains it; the longest matching output wins."""
        hits = [
            (len(o["path"]), s, o["path"])
            for s, e in self.stages.items()
            for o in e.get("outs") or []
            if _inside(rel, o["path"])
        ]
        return (max(hits)[1], max(hits)[2]) if hits else None

    def dep_producer(self, dep: str) -> tuple[str, str] | None:
        """The stage whose output a dependency is, lies in, or (a dependency on a whole folder) contains."""
        return self.producer(dep) or next(
            ((s, o["path"]) for s, e in self.stages.items() for o in e.get("outs") or [] if _inside(o["path"], dep)),
            None,
        )

    def out_hash(self, stage: str, path: str) -> str | None:
        return next((_hash(o) for o in self.stages[stage].get("outs") or [] if o["path"] == path), None)

    def not_produced(self, rel: str) -> LineageError:
        pending = {s: o for s, o in _declared_outputs(self.root).items() if s not in self.stages}
        owner = next((s for s, outs in pending.items() if any(_inside(rel, o) for o in outs)), None)
        lines = [
            f"stage {owner} declares {rel} in dvc.yaml but has not run yet (`dvc repro {owner}`)"
            if owner
            else f"no stage in {self.root / 'dvc.lock'} produced {rel}",
            "outputs by stage:",
        ]
        lines += [f"  {s}: {', '.join(o['path'] for o in e.get('outs') or [])}" for s, e in self.stages.items()]
        lines += [f"  {s} (not run yet): {', '.join(o)}" for s, o in pending.items()]
        return LineageError("\n".join(lines))


def _read_meta(root: Path, outs: list[str]) -> tuple[dict | None, str | None]:
    for o in outs:
        p = root / metadata_path(o)
        if p.exists():
            try:
                return json.loads(p.read_text()), str(metadata_path(o))
            except json.JSONDecodeError as e:
                raise LineageError(
                    f"{p} is not valid JSON ({e}); re-run its stage (`dvc repro --force <stage>`)"
                ) from e
    return None, None


def _run_json_notes(root: Path, rel: str, out: str, lock_params: dict) -> list[str]:
    """A `run.json` ({"params": ...}) between the queried path and its output marks one of several runs kept in a
    persisted output (runs/rl/<run>/); dvc.lock records only the last run, so say when this one differs."""
    notes = []
    d = Path(rel)
    while _inside(d.as_posix(), out) and d.as_posix() != out:
        f = root / d / "run.json"
        if f.is_file():
            try:
                own = _flat(json.loads(f.read_text()).get("params") or {})
            except (json.JSONDecodeError, AttributeError):
                own = {}
            diffs = [
                f"{k}: {own[k]!r} here, {lock_params[k]!r} in dvc.lock"
                for k in sorted(own)
                if k in lock_params and own[k] != lock_params[k]
            ]
            if diffs:
                notes.append(
                    f"{d.as_posix()} was trained under other parameters than the last run dvc.lock records "
                    f"({'; '.join(diffs)}); its own parameters are in {d.as_posix()}/run.json"
                )
        d = d.parent
    return notes


def trace(path: str | os.PathLike, root: str | os.PathLike | None = None) -> dict:
    """The lineage tree of `path`: {"path", "root", "node"}; each node holds its stage's cmd, params, deps (md5 and
    producing stage), metadata (code revision, time, flow run), notes, manifests and upstream nodes."""
    root = Path(root) if root is not None else find_root(path)
    lock = _Lock(root)
    rel = _rel(path, root)
    hit = lock.producer(rel)
    if hit is None:
        raise lock.not_produced(rel)
    seen: set[str] = set()
    node = _node(lock, hit[0], hit[1], seen)
    node["notes"] = _run_json_notes(root, rel, hit[1], node["params"]) + node["notes"]
    return {"path": rel, "root": str(root), "node": node}


def _node(lock: _Lock, stage: str, via: str, seen: set[str]) -> dict:
    if stage in seen:
        return {"stage": stage, "via": via, "seen": True}
    seen.add(stage)
    entry = lock.stages[stage]
    outs = [o["path"] for o in entry.get("outs") or []]
    params = _lock_params(entry)
    meta, meta_file = _read_meta(lock.root, [via] + [o for o in outs if o != via])
    notes = []
    if meta is None:
        commit = _lock_commit(lock.root)
        notes.append(
            f"no metadata file {metadata_path(via)} (outputs restored by dvc pull/checkout/exp apply have none)"
            + (f"; dvc.lock was last committed in {commit}" if commit else "")
        )
    else:
        mine = {k: v for k, v in _flat(meta.get("params") or {}).items()}
        diffs = [
            f"{k}: {params[k]!r} in dvc.lock, {mine[k]!r} in metadata"
            for k in sorted(mine)
            if k in params and mine[k] != params[k]
        ]
        if diffs:
            notes.append(f"{meta_file} was written by another run than dvc.lock records ({'; '.join(diffs)})")
    deps, upstream = [], []
    for d in entry.get("deps") or []:
        prod = lock.dep_producer(d["path"])
        dep = {"path": d["path"], "hash": _hash(d), "producer": prod[0] if prod else None}
        deps.append(dep)
        if prod:
            now = lock.out_hash(prod[0], d["path"])
            if now is not None and now != dep["hash"]:
                notes.append(
                    f"{d['path']} changed after this stage ran (md5 {dep['hash']} then, {now} now): `dvc repro` to update"
                )
            if prod[0] not in {u["stage"] for u in upstream}:  # one entry per upstream stage
                upstream.append(_node(lock, prod[0], prod[1], seen))
    manifests = [{"output": o, **m} for o in outs for m in _manifest_summary(lock.root / o)]
    return {
        "stage": stage,
        "via": via,
        "cmd": entry.get("cmd"),
        "params": params,
        "deps": deps,
        "outs": [{"path": o["path"], "hash": _hash(o)} for o in entry.get("outs") or []],
        "meta": meta,
        "meta_file": meta_file,
        "notes": notes,
        "manifests": manifests,
        "upstream": upstream,
    }


# ------------------------------------------------------------------------------------------------ rendering


def _walk(node: dict, depth: int = 0):
    yield depth, node
    for up in node.get("upstream", []):
        yield from _walk(up, depth + 1)


def describe_code(meta: dict | None) -> str:
    """One line: commit (clean, or the files that differed), time, Prefect flow run, DVC experiment."""
    if not meta:
        return "not recorded"
    g = meta.get("git") or {}
    rev = g.get("commit") or f"unknown ({g.get('note', 'no git')})"
    dirty = (
        f" + uncommitted changes in {', '.join(g.get('changed') or [])}"
        if g.get("dirty")
        else " (clean)"
        if g.get("commit")
        else ""
    )
    run = f", Prefect flow run {meta['prefect_flow_run_id']}" if meta.get("prefect_flow_run_id") else ""
    exp = meta.get("dvc_experiment")
    exp = f", DVC experiment {exp.get('name')} on baseline {exp.get('baseline_rev')}" if exp else ""
    return f"{rev}{dirty}, ran {meta.get('time', '?')}{run}{exp}"


def describe_machine(meta: dict | None) -> str:
    """One line: CPU (its vector and bf16 flags), torch threads, GPU, torch version; "not recorded" for older runs."""
    m = (meta or {}).get("machine")
    if not m:
        return "not recorded"
    flags = ", ".join(m["cpu_flags"]) or "no AVX2"
    gpu = f", GPU {m['gpu']}" if m.get("gpu") else ""
    return (
        f"{m['cpu']} ({m['cpu_count']} CPUs; {flags}; bf16 {'native' if m['cpu_bf16'] else 'emulated'}"
        f"{'; dtype auto: ' + m['cpu_auto_dtype'] if 'cpu_auto_dtype' in m else ''}), "
        f"torch {m['versions'].get('torch', '?')} on {m['torch_threads']} threads{gpu}"
    )


def _fmt(v: Any) -> str:
    """Values as in YAML/JSON (`true`, `null`, `[greedy, sampled]` as a JSON list); strings bare."""
    return v if isinstance(v, str) else json.dumps(v)


def render_text(tree: dict) -> str:
    lines = [f"lineage of {tree['path']} (repository {tree['root']})", ""]
    for depth, n in _walk(tree["node"]):
        pad = "    " * depth
        head = f"{pad}{'└── ' if depth else ''}{n['via']}  <-  stage {n['stage']}"
        if n.get("seen"):
            lines.append(head + "  (shown above)")
            continue
        pad += "    " if depth else "  "
        lines += [head, f"{pad}cmd: {n['cmd']}", f"{pad}code: {describe_code(n['meta'])}"]
        lines.append(f"{pad}machine: {describe_machine(n['meta'])}")
        lines += [f"{pad}note: {x}" for x in n["notes"]]
        if n["params"]:
            lines.append(f"{pad}params:")
            lines += [f"{pad}  {k}: {_fmt(v)}" for k, v in n["params"].items()]
        lines.append(f"{pad}deps:")
        lines += [
            f"{pad}  {d['path']}  md5 {d['hash']}" + (f"  <- {d['producer']}" if d["producer"] else "")
            for d in n["deps"]
        ]
        lines.append(f"{pad}outs:")
        lines += [f"{pad}  {o['path']}  md5 {o['hash']}" for o in n["outs"]]
        inputs = (n["meta"] or {}).get("inputs") or {}
        if inputs:
            lines.append(f"{pad}external inputs:")
            lines += [f"{pad}  {k}: {_fmt(v)}" for k, v in inputs.items()]
        for m in n["manifests"]:
            lines.append(
                f"{pad}manifest {m['output']}/{m['manifest']}: {m['games']} games ({', '.join(m['splits'])}), "
                f"game files sha256 digest {m['games_sha256'][:16]}"
            )
    return "\n".join(lines) + "\n"


def render_markdown(tree: dict) -> str:
    lines = [
        f"# Lineage of `{tree['path']}`",
        "",
        f"Repository `{tree['root']}`; each stage lists its upstream stages after it.",
        "",
    ]
    for depth, n in _walk(tree["node"]):
        title = f"{'#' * min(depth + 2, 6)} `{n['via']}` ← stage `{n['stage']}`"
        if n.get("seen"):
            lines += [title + " (shown above)", ""]
            continue
        lines += [title, "", f"- cmd: `{n['cmd']}`", f"- code: {describe_code(n['meta'])}"]
        lines.append(f"- machine: {describe_machine(n['meta'])}")
        lines += [f"- **note**: {x}" for x in n["notes"]]
        for k, v in ((n["meta"] or {}).get("inputs") or {}).items():
            lines.append(f"- external input {k}: `{_fmt(v)}`")
        for m in n["manifests"]:
            lines.append(
                f"- manifest `{m['output']}/{m['manifest']}`: {m['games']} games ({', '.join(m['splits'])}), "
                f"game files sha256 digest `{m['games_sha256'][:16]}`"
            )
        if n["params"]:
            lines += [
                "",
                "| parameter | value |",
                "|---|---|",
                *[f"| `{k}` | `{_fmt(v)}` |" for k, v in n["params"].items()],
            ]
        lines += ["", "| dependency | md5 | produced by |", "|---|---|---|"]
        lines += [f"| `{d['path']}` | `{d['hash']}` | {d['producer'] or '–'} |" for d in n["deps"]]
        lines += ["", "| output | md5 |", "|---|---|", *[f"| `{o['path']}` | `{o['hash']}` |" for o in n["outs"]], ""]
    return "\n".join(lines)


def render_html(tree: dict) -> str:
    """A self-contained page: one nested, collapsible block per stage."""
    e = html.escape

    def table(head: list[str], rows: list[list[str]]) -> str:
        return (
            "<table><tr>"
            + "".join(f"<th>{e(h)}</th>" for h in head)
            + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows)
            + "</table>"
        )

    def block(n: dict) -> str:
        title = f"<code>{e(n['via'])}</code> ← stage <b>{e(n['stage'])}</b>"
        if n.get("seen"):
            return f"<div class='stage seen' data-stage='{e(n['stage'])}'>{title} (shown above)</div>"
        items = [
            f"<li>cmd: <code>{e(str(n['cmd']))}</code></li>",
            f"<li>code: {e(describe_code(n['meta']))}</li>",
            f"<li>machine: {e(describe_machine(n['meta']))}</li>",
        ]
        items += [f"<li class='note'>note: {e(x)}</li>" for x in n["notes"]]
        items += [
            f"<li>external input {e(k)}: <code>{e(_fmt(v))}</code></li>"
            for k, v in ((n["meta"] or {}).get("inputs") or {}).items()
        ]
        items += [
            f"<li>manifest <code>{e(m['output'])}/{e(m['manifest'])}</code>: {m['games']} games, game files sha256 digest "
            f"<code>{m['games_sha256'][:16]}</code></li>"
            for m in n["manifests"]
        ]
        body = "<ul>" + "".join(items) + "</ul>"
        if n["params"]:
            body += table(["parameter", "value"], [[k, _fmt(v)] for k, v in n["params"].items()])
        body += table(
            ["dependency", "md5", "produced by"], [[d["path"], d["hash"], d["producer"] or "–"] for d in n["deps"]]
        )
        body += table(["output", "md5"], [[o["path"], o["hash"]] for o in n["outs"]])
        body += "".join(block(u) for u in n["upstream"])
        return f"<details open class='stage' data-stage='{e(n['stage'])}'><summary>{title}</summary>{body}</details>"

    style = (
        "body{font-family:system-ui,sans-serif;margin:2em;max-width:75em}details.stage,div.stage{margin:.6em 0 .6em 1.2em;"
        "border-left:3px solid #8ab;padding-left:.8em}table{border-collapse:collapse;margin:.4em 0}td,th{border:1px solid #ccc;"
        "padding:2px 6px;font-size:90%;text-align:left}.note{color:#a40}code{background:#f4f4f4}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>Lineage of {e(tree['path'])}</title><style>{style}</style>"
        f"</head><body><h1>Lineage of <code>{e(tree['path'])}</code></h1><p>Repository <code>{e(tree['root'])}</code></p>"
        f"{block(tree['node'])}</body></html>\n"
    )


RENDERERS = {
    "text": render_text,
    "md": render_markdown,
    "html": render_html,
    "json": lambda t: json.dumps(t, indent=2, default=str) + "\n",
}
