"""Skill corpus browser: list, filter and diff the skills the RL stage wrote, epoch by epoch and run by run.

Input: `runs/rl/<run>/epoch_NNN/skills.jsonl` (one line per analyzed episode: the Skill fields, "update",
"trajectory" {won, episode_return, length, invalid_count, task, actions} and "rescore" {tokens, delta_mean,
gate_mean}; written by `seed_core.stages.rl.save_epoch`). Each entry is tagged with its run (the folder
above the epoch) and epoch (from `epoch_NNN`).

Diff. A skill is split into rules (sentences), each normalized so that the same rule about different objects
counts once: lower case, every number replaced by `N` (`cabinet 3` -> `cabinet N`), whitespace collapsed, end
punctuation dropped. A rule's count on a side is the number of skills containing it (at most once per skill).
"Moved the most probability" ranks skills by `rescore.delta_mean`: the mean, over the episode's own response
tokens, of log p(token | skill in context) - log p(token | no skill) under the rollout policy; it is what the
gated OPD loss pulls the student towards.
"""

from __future__ import annotations

import glob
import json
import os
import re
import statistics
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from seed_core.records import epoch_of

DEFAULT_GLOB = "runs/rl/*/epoch_*/skills.jsonl"
CORPUS = "skills.jsonl"


class CorpusError(ValueError):
    """No corpus where one was asked for, or a corrupt line; the message names the path."""


def find_corpora(specs: Iterable[str] = ()) -> list[Path]:
    """skills.jsonl files from specs that are files, epoch folders, run folders (all their epochs) or globs of
    those; no spec means DEFAULT_GLOB. Sorted by absolute path, de-duplicated."""
    specs = list(specs) or [DEFAULT_GLOB]
    found: list[Path] = []
    for spec in specs:
        matches = (
            [Path(m) for m in sorted(glob.glob(spec))]
            if glob.has_magic(spec)
            else [Path(spec)]
            if Path(spec).exists()
            else []
        )
        files = []
        for m in matches:
            if m.is_file():
                files.append(m)
            elif (m / CORPUS).is_file():
                files.append(m / CORPUS)
            else:
                files += sorted(m.glob(f"epoch_*/{CORPUS}"))
        if not files:
            raise CorpusError(
                f"no skill corpus at {spec!r}: give a skills.jsonl, an epoch folder, a run folder "
                f"(runs/rl/<run>) or a glob; the RL stage writes {DEFAULT_GLOB}"
            )
        found += files
    unique = {Path(os.path.abspath(f)): f for f in found}  # the same file named two ways counts once
    return sorted(unique.values(), key=lambda f: os.path.abspath(f))


def load(paths: Iterable[Path]) -> list[dict]:
    """Every entry of the given corpora, tagged with "run", "epoch" (None outside an epoch_NNN folder), "file"."""
    out = []
    for path in paths:
        epoch = epoch_of(path.parent)
        run = path.parent.parent.name if epoch is not None else path.parent.name
        with open(path, "rb") as f:
            for i, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8")
                    if not line.strip():
                        continue
                    entry = json.loads(line)
                    if not isinstance(entry, dict):
                        raise ValueError(f"a JSON {type(entry).__name__}, not an object")
                except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
                    raise CorpusError(
                        f"{path}:{i} is not valid JSON ({e}); the file is damaged: delete its epoch folder and re-run "
                        "the rl stage (`dvc repro rl`), which trains that epoch again"
                    ) from e
                out.append({**entry, "run": run, "epoch": epoch, "file": str(path)})
    return out


def select(
    skills: list[dict],
    epochs: Iterable[int] = (),
    task_types: Iterable[str] = (),
    outcomes: Iterable[str] = (),
    parse_statuses: Iterable[str] = (),
    runs: Iterable[str] = (),
) -> list[dict]:
    """Entries matching every given filter; within a filter any value matches. Task types and runs match as
    substrings (`heat`, `seed-grpo`), outcomes and parse statuses exactly."""
    epochs, task_types, outcomes, parse_statuses, runs = map(list, (epochs, task_types, outcomes, parse_statuses, runs))
    return [
        s
        for s in skills
        if (not epochs or s.get("epoch") in epochs)
        and (not task_types or any(t in s.get("task_type", "") for t in task_types))
        and (not outcomes or s.get("outcome") in outcomes)
        and (not parse_statuses or s.get("parse_status") in parse_statuses)
        and (not runs or any(r in s["run"] for r in runs))
    ]


def delta(s: dict) -> float:
    return float((s.get("rescore") or {}).get("delta_mean", 0.0))


def scored(s: dict) -> bool:
    """Whether the skill was re-scored (no skill parsed, or a method without skills: nothing measured, not Δ = 0)."""
    return (s.get("rescore") or {}).get("tokens", 0) > 0


_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+|\n+")


def normalize(text: str) -> str:
    """`Go to Cabinet 3 first.` -> `go to cabinet N first`."""
    t = _NUMBER.sub("N", text.lower())
    t = re.sub(r"\s+", " ", t).strip()
    return re.sub(r"^(?:[-*•]|N[.)])\s*", "", t).rstrip(" .;!?")


def rules(text: str) -> list[str]:
    """The distinct normalized sentences of a skill, in order."""
    return list(dict.fromkeys(r for r in (normalize(p) for p in _SENTENCE_END.split(text or "")) if r))


def summary(skills: list[dict]) -> dict[str, Any]:
    return {
        "skills": len(skills),
        "runs": sorted({s["run"] for s in skills}),
        "epochs": sorted({s["epoch"] for s in skills if s["epoch"] is not None}),
        "outcome": dict(Counter(s.get("outcome") for s in skills)),
        "parse_status": dict(Counter(s.get("parse_status") for s in skills)),
        "scored": sum(map(scored, skills)),
        "delta_mean": statistics.fmean(delta(s) for s in skills if scored(s)) if any(map(scored, skills)) else None,
    }


def _rule_stats(skills: list[dict]) -> dict[str, dict]:
    stats: dict[str, dict] = {}
    for s in skills:
        for r in rules(s.get("skill", "")):
            st = stats.setdefault(r, {"count": 0, "deltas": []})
            st["count"] += 1
            if scored(s):
                st["deltas"].append(delta(s))
    return {
        r: {"count": st["count"], "delta_mean": statistics.fmean(st["deltas"]) if st["deltas"] else None}
        for r, st in stats.items()
    }


def diff(a: list[dict], b: list[dict], top: int = 10) -> dict[str, Any]:
    """How corpus B differs from corpus A: rule recurrence on both sides, rules that appeared and disappeared
    (sorted by count, then text), and each side's `top` re-scored skills by mean Δ with the count of skills
    sharing their normalized text. Mean Δ of a rule or a side averages re-scored skills only (None if none)."""
    ra, rb = _rule_stats(a), _rule_stats(b)

    def row(r: str) -> dict:
        return {
            "rule": r,
            "count_a": ra.get(r, {}).get("count", 0),
            "count_b": rb.get(r, {}).get("count", 0),
            "delta_mean_a": ra.get(r, {}).get("delta_mean"),
            "delta_mean_b": rb.get(r, {}).get("delta_mean"),
        }

    def order(keys: Iterable[str]) -> list[dict]:
        return sorted(
            (row(r) for r in keys), key=lambda x: (-max(x["count_a"], x["count_b"]), -x["count_b"], x["rule"])
        )

    def movers(side: list[dict]) -> list[dict]:
        same = Counter(normalize(s.get("skill", "")) for s in side)
        ranked = sorted(filter(scored, side), key=lambda s: (-delta(s), s.get("traj_id", "")))[:top]
        return [
            {
                "delta_mean": delta(s),
                "same_text": same[normalize(s.get("skill", ""))],
                "run": s["run"],
                "epoch": s["epoch"],
                "task_type": s.get("task_type"),
                "outcome": s.get("outcome"),
                "traj_id": s.get("traj_id"),
                "skill": s.get("skill", ""),
            }
            for s in ranked
        ]

    return {
        "a": summary(a),
        "b": summary(b),
        "recurring": order(set(ra) & set(rb)),
        "appeared": order(set(rb) - set(ra)),
        "disappeared": order(set(ra) - set(rb)),
        "top_delta_a": movers(a),
        "top_delta_b": movers(b),
    }


# ------------------------------------------------------------------------------------------------ text


def _clip(text: str, width: int) -> str:
    text = " ".join((text or "").split())
    return text if width <= 0 or len(text) <= width else text[: width - 1] + "…"


def render_list(skills: list[dict], width: int = 120) -> str:
    """One line of provenance and one of skill text per entry, then totals."""
    lines = []
    for s in skills:
        lines.append(
            f"{s['run']} epoch {s['epoch']} update {s.get('update')}  {s.get('task_type')}  {s.get('outcome')}  "
            f"parse={s.get('parse_status')}  Δmean={f'{delta(s):+.4f}' if scored(s) else '-'}  {s.get('traj_id')}"
        )
        lines.append("    " + _clip(s.get("skill", "") or f"(no skill; raw: {s.get('raw_output', '')})", width))
    st = summary(skills)
    mean = "-" if st["delta_mean"] is None else f"{st['delta_mean']:+.4f}"
    lines.append(
        f"{st['skills']} skills; outcome {st['outcome']}; parse status {st['parse_status']}; mean Δ {mean} over {st['scored']} re-scored"
    )
    return "\n".join(lines) + "\n"


def render_diff(d: dict, top: int = 10, width: int = 100) -> str:
    def f(x: float | None) -> str:
        return "     -" if x is None else f"{x:+.4f}"

    def side(name: str, st: dict) -> str:
        return (
            f"{name}: {st['skills']} skills from {', '.join(st['runs']) or '-'} epochs {st['epochs'] or '-'}; "
            f"outcome {st['outcome']}; parse status {st['parse_status']}; mean Δ {f(st['delta_mean']).strip()} over {st['scored']} re-scored"
        )

    lines = [side("A", d["a"]), side("B", d["b"]), ""]
    for key, title in (
        ("recurring", "rules in both"),
        ("appeared", "rules only in B (appeared)"),
        ("disappeared", "rules only in A (disappeared)"),
    ):
        rows = d[key]
        lines.append(f"{title}: {len(rows)}" + (f", top {top}" if len(rows) > top else ""))
        if rows:
            lines.append("  count A  count B  Δ A      Δ B      rule")
            lines += [
                f"  {r['count_a']:7d}  {r['count_b']:7d}  {f(r['delta_mean_a'])}  {f(r['delta_mean_b'])}  {_clip(r['rule'], width)}"
                for r in rows[:top]
            ]
        lines.append("")
    for key, name in (("top_delta_a", "A"), ("top_delta_b", "B")):
        lines.append(
            f"skills that moved the most probability in {name} (largest rescore.delta_mean; ×n = skills with the same normalized text):"
        )
        lines += [
            f"  {m['delta_mean']:+.4f} ×{m['same_text']}  {m['task_type']} {m['outcome']} ({m['run']} epoch {m['epoch']}): {_clip(m['skill'], width)}"
            for m in d[key]
        ]
        lines.append("")
    return "\n".join(lines)
