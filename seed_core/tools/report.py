"""Comparison report: one self-contained HTML page comparing methods over seeds.

Input layout: one folder per run (what `seed sweep` writes under `results/`, or any DVC workspace):
    <run>/params.yaml                the run's parameters (rl.updates_per_epoch places epochs on the update axis)
    <run>/metrics/eval.json          required: {model: {split: {mode: {success/<type>, success/macro, ...}}}}
    <run>/metrics/rl.json            optional: OPD statistics ("mean_over_updates") and the per-epoch held-out
                                     validation ("validation": [{"epoch": 1, "val/success_rate": ...}, ...])
    <run>/metrics/rl_updates.json    optional: learning curves (a list of per-update metric dicts, "update"
                                     the 0-based update index)
    <run>/skills.jsonl               optional: sample skills; else the last epoch of
                                     <run>/runs/rl/<method>-<advantage>-s<seed>-*/ (a workspace)
A folder without params.yaml that holds run folders (e.g. `results/`) stands for all of them; its
`sweep.json` (written by `seed sweep`) adds the runs that failed to the page.

Methods and seeds. A run folder named `<method>-s<seed>` is seed <seed> of <method>; a name without that
suffix is a method of its own. Runs of one method must have the same params.yaml apart from keys named
`seed`: averaging anything else would mix experiments, so it is refused with the differing keys.

Statistics. Each cell is the mean over seeds and the half-width of a 95% Student-t confidence interval,
mean ± t(0.975, n-1) · s/√n with s the sample standard deviation (n-1 denominator); no interval for one
seed. The interval is not clipped to [0, 100] and is wide for few seeds by design (t = 12.71 for 2 seeds,
4.30 for 3). Success is in %, macro = mean over task types (the paper's Avg), micro = mean over games, both
taken from each run's eval.json and then averaged over seeds.

Learning curves. Training success is `rollout/success_rate` of each update's rollouts; validation success is
`val/success_rate`, the greedy success on the rl stage's held-out panel, logged once per epoch and placed at the
epoch's last update, `epoch * rl.updates_per_epoch - 1` (the step the rl stage logs it at). The table gives,
per method, each epoch's training success (per seed the mean over the epoch's updates, then mean ± CI over
seeds), each epoch's validation success, and each seed's mean training success over all its updates (the area
under its per-update curve divided by its length: a sample-efficiency summary that rewards learning sooner),
then mean ± CI over seeds. `write_report` also writes these numbers next to the page as JSON
(`learning_curve_summary`; report.html -> report.json), as fractions rather than %.

Paired difference. Against a baseline method (`grpo` by default, when it is among the methods): per other method,
split and mode of eval.json, and per seed that both ran, the final held-out success (success/macro of `--model`,
the eval tables' macro avg) of the method minus the baseline's for the same seed; then mean ± CI over those
paired seeds. A seed that only one of the two ran is left out, and the page says which. The two runs of one seed
share what the seed fixes (in a sweep, the training games and sampling seeds), so this interval, not the two
eval-table intervals side by side, is the one that says whether the methods differ.

Credit, skills, wall time (from rl_updates.json). The credit probe (`credit/auc/<signal>`, pooled AUC, and
`credit/auc_within/<signal>`, within-trajectory AUC, of advantage, delta, delta_action and gate for telling the
solver's optimal moves from the others, 0.5 = no better than chance; `credit/optimal_frac`) and the skill
statistics (`skills/parse_rate`, `skills/consistent`, `skills/facts_true`, `skills/outcome_true`,
`skills/move_lists_true`): per method a table of each key's mean over updates per seed, then mean ± CI over seeds,
and per-update charts of the AUCs (dashed line at 0.5) and of parse rate and consistency. A key that no seed of a
method logged (GRPO has no gate; ALFWorld has no credit probe) is left out for that method. Wall time: per run
the sum over updates of each of `time/rollout_s`, `time/analysis_s`, `time/rescore_s`, `time/update_s`, and of
the four together (`time/total_s`), then mean ± CI over seeds; the sampler sync (`time/sync_s`), validation,
evaluation and the stages before rl are not counted.

report.json (`report_summary`): {method: {...}}, fractions (seconds for wall time), each number
[mean over seeds, half-width of the 95% t-interval or None for one seed] unless said otherwise:
    seeds, train_success_by_epoch, val_success_by_epoch, train_success_auc   learning_curve_summary
    credit: {key: [m, h]}, skills: {key: [m, h]}                             per seed the mean over updates
    wall_time_s: {time/<phase>_s: [m, h], time/total_s: [m, h]}              per seed the sum over updates
    paired_difference: {split: {mode: {"baseline", "metric", "seeds", "diffs", "mean", "ci", "left_out"}}}
        (every method but the baseline; "diffs" per paired seed, in the order of "seeds"; "ci" the half-width;
        "left_out": {method: seeds only it ran, baseline: seeds only the baseline ran})
Keys of credit, skills and wall_time_s that no seed of a method logged are absent ({} when none).

Plots are SVG drawn here (no plotting dependency), embedded as base64 `data:` images: per method each seed
(thin), the mean over seeds at each update (bold) and, shaded under it, the 95% t-interval at each update
where at least 2 seeds have a value (`curves`, for any list of per-update keys). The band is drawn clipped to
the plot frame: with 2 or 3 seeds it often reaches past [0, 1], and letting it set the scale would flatten the
lines; the table has the numbers.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import json
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from seed_core.config import RLConfig
from seed_core.envs import task_columns
from seed_core.records import atomic_write_text
from seed_core.tools import corpus

# two-sided 95% Student-t quantiles t(0.975, df); for df above 30 the next lower tabulated df (conservative)
T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    16: 2.120,
    17: 2.110,
    18: 2.101,
    19: 2.093,
    20: 2.086,
    21: 2.080,
    22: 2.074,
    23: 2.069,
    24: 2.064,
    25: 2.060,
    26: 2.056,
    27: 2.052,
    28: 2.048,
    29: 2.045,
    30: 2.042,
    40: 2.021,
    60: 2.000,
    120: 1.980,
}
TRAIN_SUCCESS, VAL_SUCCESS = "rollout/success_rate", "val/success_rate"
CURVES = (
    TRAIN_SUCCESS,
    VAL_SUCCESS,
    "opd/active_token_ratio",
    "opd/gate_mean",
    "opd/gate_gt_half_ratio",
    "opd/delta_mean",
    "loss/opd",
)
# the credit probe's per-update keys (`method.update.credit_metrics`): pooled and within-trajectory AUC per signal
CREDIT_SIGNALS = ("gate", "delta_action", "delta", "advantage")
CREDIT_KEYS = tuple(f"credit/{kind}/{s}" for kind in ("auc_within", "auc") for s in CREDIT_SIGNALS) + (
    "credit/optimal_frac",
)
# whether skills parse and say true things of their episodes (`method.skills.consistency_metrics`)
SKILL_KEYS = (
    "skills/parse_rate",
    "skills/consistent",
    "skills/facts_true",
    "skills/outcome_true",
    "skills/move_lists_true",
)
SKILL_CURVES = ("skills/parse_rate", "skills/consistent")
# the update's timed phases (`method.update.Trainer.step`); WALL_TOTAL, their sum, is computed here
TIME_PHASES = ("time/rollout_s", "time/analysis_s", "time/rescore_s", "time/update_s")
WALL_TOTAL = "time/total_s"
PAIRED_METRIC = "success/macro"
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
_SEED_SUFFIX = re.compile(r"^(.*)-s(\d+)$")


class ReportError(ValueError):
    """Missing or inconsistent inputs; the message names the run and the file."""


def t_quantile(df: int) -> float:
    return T975[max(k for k in T975 if k <= df)]


def mean_ci(values: Sequence[float]) -> tuple[float, float | None]:
    """(mean, half-width of the 95% t-interval); half-width None for a single value."""
    if not values:
        raise ReportError("no values to average")
    m = statistics.fmean(values)
    if len(values) < 2:
        return m, None
    return m, t_quantile(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


@dataclass
class Run:
    name: str
    path: Path
    method: str
    seed: str
    params: dict
    eval: dict
    rl: dict | None = None
    updates: list[dict] = field(default_factory=list)
    skills: list[dict] = field(default_factory=list)


def _json(path: Path, required: bool) -> Any:
    if not path.exists():
        if required:
            raise ReportError(
                f"{path} is missing: every run folder needs metrics/eval.json (see `seed report --help` for the layout)"
            )
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ReportError(f"{path} is not valid JSON ({e})") from e


def _skills(path: Path, params: dict) -> list[dict]:
    if (path / "skills.jsonl").is_file():
        return corpus.load([path / "skills.jsonl"])
    rl = params.get("rl") or {}
    # the rl stage names run folders <method>-<advantage>-s<seed>-<hash>; a workspace may hold other runs too
    runs = sorted(
        path.glob(f"runs/rl/{rl.get('method', '*')}-{rl.get('advantage', '*')}-s{rl.get('seed', '*')}-*"),
        key=lambda p: p.stat().st_mtime,
    )
    epochs = sorted(runs[-1].glob("epoch_*/skills.jsonl")) if runs else []
    return corpus.load(epochs[-1:])


def load_run(name: str, path: Path) -> Run:
    if not (path / "params.yaml").is_file():
        raise ReportError(
            f"{path}/params.yaml is missing: a run folder holds params.yaml and metrics/ (see `seed report --help`)"
        )
    params = yaml.safe_load((path / "params.yaml").read_text()) or {}
    m = _SEED_SUFFIX.match(name)
    method, seed = (m.group(1), m.group(2)) if m else (name, str((params.get("rl") or {}).get("seed", "?")))
    return Run(
        name,
        path,
        method,
        seed,
        params,
        _json(path / "metrics/eval.json", True),
        _json(path / "metrics/rl.json", False),
        _with_timings(_json(path / "metrics/rl_updates.json", False) or [], path / "metrics/time/rl_updates.json"),
        _skills(path, params),
    )


def _with_timings(updates: list[dict], timings: Path) -> list[dict]:
    """The rl stage writes each update's `time/*` apart (metrics/time/rl_updates.json, so DVC hashes no timing):
    merged back into its update's entry by `update`."""
    by_update = {t.get("update"): t for t in _json(timings, False) or []}
    return [{**by_update.get(u.get("update"), {}), **u} for u in updates]


def discover(specs: Sequence[str]) -> tuple[list[Run], list[dict]]:
    """Runs from folders (`NAME=PATH` renames one), expanding folders of runs; plus failed sweep entries."""
    runs, failed = [], []
    for spec in specs:
        name, sep, p = spec.partition("=")
        path = Path(p if sep else spec)
        if not path.is_dir():
            raise ReportError(
                f"{path} is not a folder; give run folders (params.yaml + metrics/) or a folder of them (results/)"
            )
        if (path / "params.yaml").exists():
            runs.append(load_run(name if sep else path.resolve().name, path))
            continue
        subs = sorted(d for d in path.iterdir() if (d / "params.yaml").is_file())
        if not subs:
            raise ReportError(f"{path} holds no run folder (a folder with params.yaml and metrics/eval.json)")
        runs += [load_run(d.name, d) for d in subs]
        sweep = _json(path / "sweep.json", False) or []
        failed += [s for s in sweep if s.get("status") != "success"]
    if not runs:
        raise ReportError("no runs given")
    return runs, failed


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix[:-1]: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}."))
    return out


def _no_seeds(params: dict) -> dict[str, Any]:
    return {k: v for k, v in _flat(params).items() if k.rsplit(".", 1)[-1] != "seed"}


def group(runs: list[Run]) -> dict[str, list[Run]]:
    """Runs by method, in order of appearance; refuses a method whose runs differ in more than seeds."""
    groups: dict[str, list[Run]] = {}
    for r in runs:
        groups.setdefault(r.method, []).append(r)
    for method, rs in groups.items():
        ref = _no_seeds(rs[0].params)
        for r in rs[1:]:
            mine = _no_seeds(r.params)
            diff = sorted(k for k in set(ref) | set(mine) if ref.get(k) != mine.get(k))
            if diff:
                raise ReportError(
                    f"runs {rs[0].name} and {r.name} are seeds of method {method!r} by name but their params.yaml "
                    f"differ in {', '.join(diff)}; give them different method names"
                )
        seeds = [r.seed for r in rs]
        if len(set(seeds)) < len(seeds):
            raise ReportError(f"method {method!r} has the same seed twice: {[r.name for r in rs]}")
    return groups


# ------------------------------------------------------------------------------------------------ learning curves


def updates_per_epoch(run: Run) -> int:
    """rl.updates_per_epoch of the run; a params.yaml without the key ran with the config default."""
    return int((run.params.get("rl") or {}).get("updates_per_epoch", RLConfig.updates_per_epoch))


def points(run: Run, metric: str) -> list[tuple[int, float]]:
    """(update, value) of one run's metric, by update. Validation is logged once per epoch (in rl.json) and
    sits at the epoch's last update, so it shares the update axis with the training curves."""
    if metric == VAL_SUCCESS:
        upe = updates_per_epoch(run)
        # an epoch without a validation panel logs {"epoch": e} alone: no point, not a zero
        vals = (run.rl or {}).get("validation") or []
        return sorted((v["epoch"] * upe - 1, v[metric]) for v in vals if v.get(metric) is not None and "epoch" in v)
    return sorted((u["update"], u[metric]) for u in run.updates if u.get(metric) is not None and "update" in u)


def _epoch_values(rs: list[Run], metric: str) -> dict[int, list[float]]:
    """Epoch (1-based) -> one value per seed that has it: the mean of the metric over the epoch's updates
    (validation has one point per epoch, so it is the logged value)."""
    out: dict[int, list[float]] = {}
    for r in rs:
        upe = updates_per_epoch(r)
        per_epoch: dict[int, list[float]] = {}
        # update x (0-based) is in epoch x // upe + 1; validation's x, the epoch's last update, maps back too
        for x, y in points(r, metric):
            per_epoch.setdefault(x // upe + 1, []).append(y)
        for epoch, ys in per_epoch.items():
            out.setdefault(epoch, []).append(statistics.fmean(ys))
    return dict(sorted(out.items()))


def _update_means(rs: list[Run], metric: str) -> list[float]:
    """Per seed that logged the metric, its mean over the seed's updates. For training success this is the area
    under the per-update curve over its length, which at equal final success is higher for the method that
    learned sooner."""
    return [statistics.fmean(y for _, y in pts) for r in rs if (pts := points(r, metric))]


def _update_sums(rs: list[Run], metric: str) -> list[float]:
    """Per seed that logged the metric, its sum over the seed's updates; WALL_TOTAL sums every TIME_PHASES key."""
    keys = TIME_PHASES if metric == WALL_TOTAL else (metric,)
    return [sum(ys) for r in rs if (ys := [y for k in keys for _, y in points(r, k)])]


def _logged(groups: dict[str, list[Run]], keys: Sequence[str], prefix: str | None = None) -> list[str]:
    """The keys that some run's rl_updates.json has, in the order given, then any other key under `prefix`."""
    have = {k for rs in groups.values() for r in rs for u in r.updates for k, v in u.items() if v is not None}
    return [k for k in keys if k in have] + sorted(k for k in have - set(keys) if prefix and k.startswith(prefix))


def _per_seed_summary(rs: list[Run], keys: Sequence[str], per_seed) -> dict[str, list]:
    """{key: [mean over seeds, half-width or None]} of per_seed(rs, key), for the keys some seed has."""
    return {k: list(mean_ci(v)) for k in keys if (v := per_seed(rs, k))}


def learning_curve_summary(groups: dict[str, list[Run]]) -> dict[str, dict]:
    """{method: {"seeds", "train_success_by_epoch", "val_success_by_epoch", "train_success_auc"}}, fractions.

    Each number is [mean over seeds, half-width of the 95% t-interval or None for one seed]. The by-epoch lists
    are indexed by epoch - 1 and end at the method's last epoch with a value (so a method without validation
    has []); an epoch inside that no seed logged is None. train_success_auc is None without training curves.
    """

    def by_epoch(values: dict[int, list[float]]) -> list[list | None]:
        return [list(mean_ci(values[e])) if e in values else None for e in range(1, max(values, default=0) + 1)]

    out = {}
    for method, rs in groups.items():
        auc = _update_means(rs, TRAIN_SUCCESS)
        out[method] = {
            "seeds": len(rs),
            "train_success_by_epoch": by_epoch(_epoch_values(rs, TRAIN_SUCCESS)),
            "val_success_by_epoch": by_epoch(_epoch_values(rs, VAL_SUCCESS)),
            "train_success_auc": list(mean_ci(auc)) if auc else None,
        }
    return out


def interval_band(per_x: dict[float, list[float]]) -> list[list[tuple[float, float, float]]]:
    """The 95% t-interval as (x, low, high) at each x where at least 2 seeds have a value, split where an x has
    fewer, so that no band is drawn across an x where the interval is undefined."""
    segments: list[list[tuple[float, float, float]]] = [[]]
    for x in sorted(per_x):
        if len(per_x[x]) >= 2:
            m, h = mean_ci(per_x[x])
            segments[-1].append((x, m - h, m + h))
        elif segments[-1]:
            segments.append([])
    return [seg for seg in segments if seg]


# ------------------------------------------------------------------------------------------------ paired difference


def _check_model(groups: dict[str, list[Run]], model: str) -> None:
    for rs in groups.values():
        for r in rs:
            if model not in r.eval:
                raise ReportError(
                    f"{r.path}/metrics/eval.json has no model {model!r} (it has {sorted(r.eval)}); choose one with --model"
                )


def _splits_modes(groups: dict[str, list[Run]], model: str) -> list[tuple[str, str]]:
    """(split, mode) of the first run's eval.json for `model`: the eval tables, and the paired differences."""
    _check_model(groups, model)
    first = next(iter(groups.values()))[0].eval[model]
    return [(split, mode) for split, modes in first.items() for mode in modes]


def _final(run: Run, model: str, split: str, mode: str, key: str) -> float | None:
    """One value of a run's eval.json (what the eval tables average), None where the run lacks it."""
    return run.eval[model].get(split, {}).get(mode, {}).get(key)


def _seed_sort(seed: str) -> tuple:
    return (0, int(seed), "") if seed.isdigit() else (1, 0, seed)


def _seed_json(seed: str) -> int | str:
    return int(seed) if seed.isdigit() else seed


def paired_difference(groups: dict[str, list[Run]], model: str = "rl", baseline: str = "grpo") -> dict[str, dict]:
    """{method: {split: {mode: {"baseline", "metric", "seeds", "diffs", "mean", "ci", "left_out"}}}} for every
    method but `baseline`; {} when `baseline` is not among the methods.

    Per seed that both the method and the baseline ran (and whose eval.json has PAIRED_METRIC for the split and
    mode), diffs holds method - baseline of the final held-out success of `model`, a fraction; mean and ci are
    its mean and the half-width of the 95% t-interval over those paired seeds (ci None for one seed, both None
    for none). left_out: {method: seeds only it has, baseline: seeds only the baseline has}."""
    if baseline not in groups:
        return {}
    out: dict[str, dict] = {}
    for method, rs in groups.items():
        if method == baseline:
            continue
        per: dict[str, dict] = {}
        for split, mode in _splits_modes(groups, model):
            mine, base = (
                {r.seed: v for r in runs if (v := _final(r, model, split, mode, PAIRED_METRIC)) is not None}
                for runs in (rs, groups[baseline])
            )
            seeds = sorted(mine.keys() & base.keys(), key=_seed_sort)
            diffs = [mine[s] - base[s] for s in seeds]
            m, h = mean_ci(diffs) if diffs else (None, None)
            per.setdefault(split, {})[mode] = {
                "baseline": baseline,
                "metric": PAIRED_METRIC,
                "seeds": [_seed_json(s) for s in seeds],
                "diffs": diffs,
                "mean": m,
                "ci": h,
                "left_out": {
                    name: [_seed_json(s) for s in sorted(one.keys() - other.keys(), key=_seed_sort)]
                    for name, one, other in ((method, mine, base), (baseline, base, mine))
                },
            }
        out[method] = per
    return out


def report_summary(groups: dict[str, list[Run]], model: str = "rl", baseline: str = "grpo") -> dict[str, dict]:
    """What report.json holds: per method, learning_curve_summary's entry plus, fractions and seconds,
    "credit" and "skills" ({key: [mean, half-width]} over seeds of each seed's mean over its updates),
    "wall_time_s" ({phase: [mean, half-width]} over seeds of each seed's sum over its updates, and WALL_TOTAL)
    and, for every method but `baseline` when it is present, "paired_difference" (`paired_difference`)."""
    out = learning_curve_summary(groups)
    credit, skills = _logged(groups, CREDIT_KEYS, "credit/"), _logged(groups, SKILL_KEYS)
    paired = paired_difference(groups, model, baseline)
    for method, rs in groups.items():
        out[method] |= {
            "credit": _per_seed_summary(rs, credit, _update_means),
            "skills": _per_seed_summary(rs, skills, _update_means),
            "wall_time_s": _per_seed_summary(rs, (*TIME_PHASES, WALL_TOTAL), _update_sums),
        }
        if method in paired:
            out[method]["paired_difference"] = paired[method]
    return out


# ------------------------------------------------------------------------------------------------ SVG


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    step = (hi - lo) / (n - 1)
    return [lo + i * step for i in range(n)]


def svg_chart(
    title: str,
    series: list[dict],
    width: int = 640,
    height: int = 300,
    unit: bool = False,
    ref: float | None = None,
) -> str:
    """A line chart: series = [{"label", "color", "x", "y", "bold"}, optional "band": segments of (x, low, high)
    drawn as shaded areas]; the legend lists bold series. The y range comes from the lines alone (and `ref`);
    `unit` (a share or an AUC) or a title that names a rate puts values within [0, 1] on [0, 1]. `ref`: a dashed
    horizontal reference line at that value (0.5 for an AUC: chance)."""
    left, right, top, bottom = 60, 170, 30, 40
    xs = [x for s in series for x in s["x"]]
    ys = [y for s in series for y in s["y"]] + ([] if ref is None else [ref])
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if 0 <= y0 and y1 <= 1 and (unit or title.endswith("rate") or "ratio" in title or "gate" in title):
        y0, y1 = 0.0, 1.0  # rates on their natural scale, so charts compare at a glance
    if y1 - y0 < 1e-12:
        y0, y1 = y0 - 0.5, y1 + 0.5
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    pw, ph = width - left - right, height - top - bottom

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def py(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * ph

    e = html.escape
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'font-family="sans-serif" font-size="11"><rect width="100%" height="100%" fill="white"/>',
        f'<text x="{left}" y="18" font-size="13" font-weight="bold">{e(title)}</text>',
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>',
    ]
    for t in _ticks(y0, y1):
        parts.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#eee"/>'
            f'<text x="{left - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{t:.3g}</text>'
        )
    xt = sorted(set(xs))
    for t in xt[:: max(1, math.ceil(len(xt) / 10))]:
        parts.append(f'<text x="{px(t):.1f}" y="{top + ph + 16}" text-anchor="middle">{t:g}</text>')
    parts.append(f'<text x="{left + pw / 2}" y="{height - 6}" text-anchor="middle">update</text>')
    # bands first so that every line stays on top; clipped to the frame, as the y range ignores them
    parts.append(
        f'<defs><clipPath id="frame"><rect x="{left}" y="{top}" width="{pw}" height="{ph}"/></clipPath></defs>'
    )
    for s in series:
        for seg in s.get("band", []):
            if len(seg) == 1:  # a lone x: an interval bar
                x, lo, hi = seg[0]
                parts.append(
                    f'<line class="band" x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{py(hi):.1f}" y2="{py(lo):.1f}" '
                    f'stroke="{s["color"]}" stroke-width="6" opacity="0.2" clip-path="url(#frame)"/>'
                )
                continue
            outline = [(x, hi) for x, _, hi in seg] + [(x, lo) for x, lo, _ in reversed(seg)]
            pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in outline)
            parts.append(
                f'<polygon class="band" points="{pts}" fill="{s["color"]}" fill-opacity="0.2" stroke="none" '
                f'clip-path="url(#frame)"/>'
            )
    if ref is not None:
        parts.append(
            f'<line class="ref" x1="{left}" x2="{left + pw}" y1="{py(ref):.1f}" y2="{py(ref):.1f}" stroke="#555" '
            f'stroke-dasharray="5 4"/><text x="{left + pw - 4}" y="{py(ref) - 4:.1f}" text-anchor="end" '
            f'fill="#555">{ref:g}</text>'
        )
    for s in series:
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(s["x"], s["y"]))
        w, op = ("2.5", "1") if s["bold"] else ("1", "0.35")
        parts.append(f'<polyline points="{pts}" fill="none" stroke="{s["color"]}" stroke-width="{w}" opacity="{op}"/>')
        if len(s["x"]) == 1:
            parts.append(f'<circle cx="{px(s["x"][0]):.1f}" cy="{py(s["y"][0]):.1f}" r="3" fill="{s["color"]}"/>')
    for i, s in enumerate(x for x in series if x["bold"]):
        y = top + 10 + 16 * i
        parts.append(
            f'<line x1="{left + pw + 12}" x2="{left + pw + 32}" y1="{y}" y2="{y}" stroke="{s["color"]}" stroke-width="2.5"/>'
            f'<text x="{left + pw + 38}" y="{y + 4}">{e(s["label"])}</text>'
        )
    return "".join(parts) + "</svg>"


def _img(svg: str, alt: str) -> str:
    data = base64.b64encode(svg.encode()).decode()
    return f'<img class="chart" alt="{html.escape(alt)}" src="data:image/svg+xml;base64,{data}">'


def _series(groups: dict[str, list[Run]], metric: str) -> list[dict]:
    """svg_chart's series of one metric: per method (a colour each, by its place among all methods) each seed
    thin, and the mean over seeds at each update bold over its 95% t-band; [] where no run logged it."""
    series = []
    for i, (method, rs) in enumerate(groups.items()):
        color = COLORS[i % len(COLORS)]
        per_update: dict[float, list[float]] = {}
        logged = 0  # seeds that logged the metric (a run may lack validation), for the legend
        for r in rs:
            pts = points(r, metric)
            if pts:
                logged += 1
                series.append(
                    {
                        "label": f"{method} s{r.seed}",
                        "color": color,
                        "x": [p[0] for p in pts],
                        "y": [p[1] for p in pts],
                        "bold": False,
                    }
                )
            for x, y in pts:
                per_update.setdefault(x, []).append(y)
        if per_update:
            xs = sorted(per_update)
            series.append(
                {
                    "label": f"{method} (mean of {logged})",
                    "color": color,
                    "x": xs,
                    "y": [statistics.fmean(per_update[x]) for x in xs],
                    "bold": True,
                    "band": interval_band(per_update),
                }
            )
    return series


def curves(
    groups: dict[str, list[Run]], metrics: Sequence[str] = CURVES, unit: bool = False, ref: float | None = None
) -> list[tuple[str, str]]:
    """(metric, svg) per metric that some run logged (CURVES by default): seeds thin, mean bold over its 95%
    t-band; `unit` and `ref` as in svg_chart."""
    return [(m, svg_chart(m, series, unit=unit, ref=ref)) for m in metrics if (series := _series(groups, m))]


# ------------------------------------------------------------------------------------------------ HTML


def _cell(values: list[float], key: str, percent: bool, decimals: int | None = None) -> str:
    """Mean ± half-width: in % with 1 decimal, else with `decimals` decimals or 4 significant digits."""
    if not values:
        return f'<td data-key="{html.escape(key)}">–</td>'
    m, h = mean_ci(values)
    k = 100.0 if percent else 1.0
    if percent or decimals is not None:
        d = 1 if percent else decimals
        text = f"{k * m:.{d}f}" + ("" if h is None else f" ± {k * h:.{d}f}")
    else:
        text = f"{m:.4g}" + ("" if h is None else f" ± {h:.3g}")
    seeds = ", ".join(f"{k * v:.4g}" for v in values)
    return (
        f'<td data-key="{html.escape(key)}" data-mean="{m!r}" data-half="{"" if h is None else repr(h)}" '
        f'title="n={len(values)}: {seeds}">{text}</td>'
    )


def _eval_tables(groups: dict[str, list[Run]], model: str) -> str:
    parts = []
    columns = task_columns()
    for split, mode in _splits_modes(groups, model):
        present = [
            t
            for t in columns
            if any(_final(r, model, split, mode, f"success/{t}") is not None for rs in groups.values() for r in rs)
        ]
        cols = [(f"success/{t}", columns[t]) for t in present] + [
            ("success/macro", "macro avg"),
            ("success/micro", "micro avg"),
            ("invalid_rate", "invalid rate"),
        ]
        head = "".join(f"<th>{html.escape(c)}</th>" for _, c in cols)
        rows = []
        for method, rs in groups.items():
            cells = "".join(
                _cell(
                    [v for r in rs if (v := _final(r, model, split, mode, k)) is not None],
                    f"{split}/{mode}/{method}/{k}",
                    True,
                )
                for k, _ in cols
            )
            rows.append(f"<tr><th>{html.escape(method)}</th><td>{len(rs)}</td>{cells}</tr>")
        parts.append(
            f'<h3>{html.escape(split)}, {html.escape(mode)}</h3><table class="eval" data-split="{html.escape(split)}" '
            f'data-mode="{html.escape(mode)}"><tr><th>method</th><th>seeds</th>{head}</tr>{"".join(rows)}</table>'
        )
    return "".join(parts)


def _paired_table(groups: dict[str, list[Run]], model: str, baseline: str) -> str:
    """paired_difference as a table, in percentage points: per method, split and mode the seeds paired (and those
    left out), each paired seed's difference, and their mean ± 95% interval."""
    e = html.escape
    if baseline not in groups:
        return f"<p>No paired difference: the baseline method <code>{e(baseline)}</code> is not among the runs.</p>"
    rows = []
    for method, splits in paired_difference(groups, model, baseline).items():
        for split, modes in splits.items():
            for mode, d in modes.items():
                paired = f"paired over seeds {', '.join(map(str, d['seeds']))}" if d["seeds"] else "no seed in common"
                left = "".join(
                    f"; seed{'s' if len(ss) > 1 else ''} {', '.join(map(str, ss))} left out ({name} only)"
                    for name, ss in d["left_out"].items()
                    if ss
                )
                per_seed = ", ".join(f"s{s} {100 * x:+.1f}" for s, x in zip(d["seeds"], d["diffs"])) or "–"
                rows.append(
                    f"<tr><th>{e(method)} − {e(baseline)}</th><td>{e(split)}</td><td>{e(mode)}</td>"
                    f'<td class="paired-seeds">{e(paired + left)}</td><td>{e(per_seed)}</td>'
                    f"{_cell(d['diffs'], f'paired/{method}/{split}/{mode}', True)}</tr>"
                )
    if not rows:
        return f"<p>No paired difference: <code>{e(baseline)}</code> is the only method.</p>"
    return (
        '<table class="paired"><tr><th>method − baseline</th><th>split</th><th>mode</th><th>seeds</th>'
        f"<th>per-seed difference (points)</th><th>mean difference (points)</th></tr>{''.join(rows)}</table>"
    )


def _seed_table(
    groups: dict[str, list[Run]],
    cls: str,
    keys: Sequence[str],
    per_seed,
    strip: str = "",
    decimals: int | None = None,
) -> str:
    """Per method that has a value, per key the mean ± 95% interval over seeds of per_seed(rs, key) (one value
    per seed, e.g. _update_means); `seeds` counts the seeds with a value for some key; headers lose `strip`;
    `decimals` as in _cell."""
    e = html.escape
    rows = []
    for method, rs in groups.items():
        values = {k: per_seed(rs, k) for k in keys}
        if not any(values.values()):
            continue
        cells = "".join(_cell(values[k], f"{cls}/{method}/{k}", False, decimals) for k in keys)
        rows.append(f"<tr><th>{e(method)}</th><td>{max(map(len, values.values()))}</td>{cells}</tr>")
    head = "".join(f"<th>{e(k.removeprefix(strip))}</th>" for k in keys)
    return f'<table class="{cls}"><tr><th>method</th><th>seeds</th>{head}</tr>{"".join(rows)}</table>' if rows else ""


def _opd_table(groups: dict[str, list[Run]]) -> str:
    keys = sorted({k for rs in groups.values() for r in rs if r.rl for k in (r.rl.get("mean_over_updates") or {})})
    rows = []
    for method, rs in groups.items():
        have = [r for r in rs if r.rl]
        if not have:
            continue
        cells = "".join(
            _cell(
                [r.rl["mean_over_updates"][k] for r in have if k in (r.rl.get("mean_over_updates") or {})],
                f"opd/{method}/{k}",
                False,
            )
            for k in keys
        )
        vals = [
            r.rl["validation"][-1]["val/success_rate"]
            for r in have
            if (r.rl.get("validation") or [{}])[-1].get("val/success_rate") is not None
        ]
        rows.append(
            f"<tr><th>{html.escape(method)}</th><td>{len(have)}</td>{cells}{_cell(vals, f'opd/{method}/val/success_rate', True)}</tr>"
        )
    if not rows:
        return "<p>No run has metrics/rl.json.</p>"
    head = "".join(f"<th>{html.escape(k)}</th>" for k in keys)
    return f'<table class="opd"><tr><th>method</th><th>seeds</th>{head}<th>final val success (%)</th></tr>{"".join(rows)}</table>'


def _curve_table(groups: dict[str, list[Run]]) -> str:
    """Training and validation success per epoch and the mean over all updates, per method (the numbers of
    learning_curve_summary, as table cells)."""
    train = {m: _epoch_values(rs, TRAIN_SUCCESS) for m, rs in groups.items()}
    val = {m: _epoch_values(rs, VAL_SUCCESS) for m, rs in groups.items()}
    # one set of epoch columns for all methods, "–" where a method has no value
    train_epochs = sorted(set().union(*train.values()))
    val_epochs = sorted(set().union(*val.values()))
    if not train_epochs and not val_epochs:
        return ""
    e = html.escape
    groups_head = (
        f'<th colspan="{len(train_epochs)}">training success (%), mean over the epoch\'s updates</th>'
        if train_epochs
        else ""
    ) + (f'<th colspan="{len(val_epochs)}">validation success (%)</th>' if val_epochs else "")
    epoch_head = "".join(f"<th>epoch {ep}</th>" for ep in train_epochs + val_epochs)
    rows = []
    for method, rs in groups.items():
        cells = "".join(
            _cell(train[method].get(ep, []), f"curves/{method}/{TRAIN_SUCCESS}/epoch_{ep}", True) for ep in train_epochs
        ) + "".join(
            _cell(val[method].get(ep, []), f"curves/{method}/{VAL_SUCCESS}/epoch_{ep}", True) for ep in val_epochs
        )
        auc = _cell(_update_means(rs, TRAIN_SUCCESS), f"curves/{method}/{TRAIN_SUCCESS}/all_updates", True)
        rows.append(f"<tr><th>{e(method)}</th><td>{len(rs)}</td>{cells}{auc}</tr>")
    return (
        f'<table class="curves"><tr><th rowspan="2">method</th><th rowspan="2">seeds</th>{groups_head}'
        f'<th rowspan="2">mean training success over all updates (%)</th></tr><tr>{epoch_head}</tr>{"".join(rows)}</table>'
    )


def _samples(groups: dict[str, list[Run]], n: int) -> str:
    parts = []
    for method, rs in groups.items():
        entries = [(r.seed, s) for r in rs for s in r.skills if corpus.scored(s)]
        entries.sort(key=lambda x: -corpus.delta(x[1]))
        if not entries:
            continue
        items = "".join(
            f'<li class="skill"><b>Δ {corpus.delta(s):+.4f}</b> seed {html.escape(seed)}, {html.escape(str(s.get("task_type")))}, '
            f"{html.escape(str(s.get('outcome')))}: {html.escape(s.get('skill', ''))}</li>"
            for seed, s in entries[:n]
        )
        parts.append(f"<h3>{html.escape(method)}</h3><ul>{items}</ul>")
    return "".join(parts) or "<p>No run has a skill corpus.</p>"


def _figures(charts: list[tuple[str, str]]) -> str:
    return "".join(f"<figure>{_img(svg, metric)}</figure>" for metric, svg in charts)


def _credit_section(groups: dict[str, list[Run]]) -> str:
    keys = _logged(groups, CREDIT_KEYS, "credit/")
    if not keys:
        return (
            "<p>No run logged the credit probe (<code>credit/*</code> in metrics/rl_updates.json; only environments "
            "with a solver that labels each step, such as Sokoban).</p>"
        )
    charts = curves(groups, [k for k in keys if k.startswith("credit/auc")], unit=True, ref=0.5)
    return _seed_table(groups, "credit", keys, _update_means, "credit/") + _figures(charts)


def _skills_section(groups: dict[str, list[Run]]) -> str:
    keys = _logged(groups, SKILL_KEYS)
    if not keys:
        return "<p>No run logged skill statistics (<code>skills/*</code> in metrics/rl_updates.json).</p>"
    charts = curves(groups, [k for k in SKILL_CURVES if k in keys], unit=True)
    return _seed_table(groups, "skills", keys, _update_means, "skills/") + _figures(charts)


def render(
    runs: list[Run], failed: list[dict] | None = None, model: str = "rl", samples: int = 3, baseline: str = "grpo"
) -> str:
    groups = group(runs)
    e = html.escape
    reps = {m: _no_seeds(rs[0].params) for m, rs in groups.items()}
    differ = sorted(
        k for k in set().union(*reps.values()) if len({json.dumps(r.get(k), sort_keys=True) for r in reps.values()}) > 1
    )
    diff_rows = "".join(
        f"<tr><th>{e(k)}</th>" + "".join(f"<td>{e(json.dumps(reps[m].get(k)))}</td>" for m in groups) + "</tr>"
        for k in differ
    )
    run_rows = "".join(
        f"<tr><td>{e(r.name)}</td><td>{e(r.method)}</td><td>{e(r.seed)}</td><td>{len(r.updates)}</td><td><code>{e(str(r.path))}</code></td></tr>"
        for rs in groups.values()
        for r in rs
    )
    fail = "".join(
        f"<li>{e(str(f.get('name')))}: {e(str(f.get('status')))} — {e(str(f.get('error', '')))}</li>"
        for f in failed or []
    )
    charts = _figures(curves(groups)) or "<p>No run has metrics/rl_updates.json.</p>"
    wall = (
        _seed_table(groups, "wall", (*TIME_PHASES, WALL_TOTAL), _update_sums, "time/", decimals=1)
        or "<p>No run logged <code>time/*_s</code> in metrics/rl_updates.json.</p>"
    )
    style = (
        "body{font-family:system-ui,sans-serif;margin:2em;max-width:80em}table{border-collapse:collapse;margin:.5em 0 1.2em}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th:first-child{text-align:left}figure{display:inline-block;margin:.5em}"
        ".skill{margin:.3em 0}.failed{color:#a00}"
    )
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>SEED comparison report</title><style>{style}</style></head><body>
<h1>SEED comparison report</h1>
<p>{len(runs)} runs, {len(groups)} methods; generated {dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}; model <code>{e(model)}</code> of each run's eval.json.
Cells: mean over seeds ± half-width of the 95% Student-t interval (t(0.975, n−1)·s/√n; none for one seed); hover a cell for the per-seed values.</p>
{f'<h2 class="failed">Failed runs</h2><ul class="failed">{fail}</ul>' if fail else ""}
<h2>Success (%), no skills in the prompt</h2>
<p>macro avg = mean over task types (the paper's Avg); micro avg = mean over games.</p>
{_eval_tables(groups, model)}
<h2>Paired difference against <code>{e(baseline)}</code> (final success, points)</h2>
<p>For each seed that both a method and <code>{e(baseline)}</code> ran: the method's final held-out success minus
<code>{e(baseline)}</code>'s for the same seed (<code>{PAIRED_METRIC}</code> of model <code>{e(model)}</code> in eval.json,
the macro avg above), in percentage points; then the mean ± 95% t-interval over those paired seeds. The two runs of a
seed share what the seed fixes (in a sweep: the training games and sampling seeds), so the spread of the differences is
the one to read for the difference, rather than the two intervals above. A seed that only one of the two ran is left
out.</p>
{_paired_table(groups, model, baseline)}
<h2>Learning curves</h2>
<p>Training success: <code>{TRAIN_SUCCESS}</code> of each update's rollouts. Validation success: <code>{VAL_SUCCESS}</code>,
greedy on the held-out panel once per epoch, plotted at the epoch's last update. Table: per epoch, each seed's mean over the
epoch's updates, then mean ± 95% interval over seeds; the last column is each seed's mean over all its updates (the area
under its curve: higher for the method that learns sooner), then over seeds. Charts: each seed thin, the mean over seeds
bold over a shaded 95% t-interval wherever ≥ 2 seeds have a value (clipped to the frame).</p>
{_curve_table(groups)}{charts}
<h2>OPD statistics (mean over updates)</h2>{_opd_table(groups)}
<h2>Credit: do the signals single out the solver's optimal moves?</h2>
<p>Where a solver labels every step (Sokoban), each update measures, on its own batch, how well each per-step signal
ranks the moves the solver calls optimal above the others, as an AUC: <code>auc/&lt;signal&gt;</code> over all pairs of
steps of the update, <code>auc_within/&lt;signal&gt;</code> only over pairs within one trajectory. AUC 0.5: the signal
does not tell the solver's optimal moves from the others (dashed line); 1: every optimal move ranks above every other.
Signals: <code>advantage</code>, the step advantage the update trained on (GRPO's is constant within a trajectory, so its
within-trajectory AUC is 0.5 by construction); <code>delta</code> and <code>delta_action</code>, the step's mean Δ
log-prob with the skill over all its tokens or its action tokens; <code>gate</code>, its mean gate.
<code>optimal_frac</code>: the share of steps labelled optimal. Table: per seed the mean over its updates, then mean ±
95% interval over seeds; a method without a signal (GRPO has no gate) has none. Charts: per update, each seed thin, the
mean over seeds bold over its 95% t-band.</p>
{_credit_section(groups)}
<h2>Skills: do they parse, and are they true?</h2>
<p>Per update, over the skills the analyzer wrote: <code>parse_rate</code>, the share that parsed;
<code>consistent</code>, the share of parsed skills that make at least one claim the environment can check and no false
one; <code>facts_true</code>, <code>outcome_true</code>, <code>move_lists_true</code>, the shares of stated counts and step
numbers, outcomes and move lists that are true (only where the environment can check claims, such as Sokoban). Table:
per seed the mean over its updates, then mean ± 95% interval over seeds. Charts: per update, as above.</p>
{_skills_section(groups)}
<h2>Wall time per run (s)</h2>
<p>Per run, the seconds each phase of an update took, summed over its updates (<code>time/rollout_s</code>,
<code>analysis_s</code>, <code>rescore_s</code>, <code>update_s</code> of rl_updates.json; <code>total_s</code> is their sum:
the sampler sync, validation, evaluation and the stages before RL are not counted), then mean ± 95% interval over seeds.
Only runs on the same kind of machine, without other jobs beside them, compare.</p>
{wall}
<h2>Sample skills (largest mean Δ log-prob)</h2>{_samples(groups, samples)}
<h2>Runs</h2>
{f'<table class="differ"><tr><th>parameter</th>{"".join(f"<th>{e(m)}</th>" for m in groups)}</tr>{diff_rows}</table>' if diff_rows else ""}
<table class="runs"><tr><th>run</th><th>method</th><th>seed</th><th>updates</th><th>folder</th></tr>{run_rows}</table>
</body></html>
"""


def write_report(
    specs: Sequence[str], out: str | Path, model: str = "rl", samples: int = 3, baseline: str = "grpo"
) -> Path:
    """The page at `out` and, next to it with the suffix .json, report_summary for scripts."""
    out = Path(out)
    summary = out.with_suffix(".json")
    if summary == out:
        raise ReportError(f"--out {out} ends in .json, where the report's numbers go; name the page *.html")
    runs, failed = discover(specs)
    atomic_write_text(out, render(runs, failed, model, samples, baseline))
    atomic_write_text(summary, json.dumps(report_summary(group(runs), model, baseline), indent=2) + "\n")
    return out
