"""Held-out success of `evaluate` runs with a 95 % percentile bootstrap interval over rooms, per decoding mode.

Usage: python eval_ci.py data/eval/<model> [more runs: seeds] [--against data/eval/<start>]
Reads <split>/<mode>-s<seed>.jsonl (or .jsonl.gz, as committed here) of each folder and prints one JSON line per
mode. Several folders (the seeds of one arm) are averaged per room first, so the interval is over rooms;
`--against` adds the paired difference per room (runs minus start) with its interval. Used for the figures in this
folder: `evaluate` itself reports success without an interval.
"""

import gzip
import json
import random
import sys
from collections import defaultdict
from pathlib import Path


def per_room(folders: list[Path], mode: str) -> tuple[dict[str, float], list[bool]]:
    """{room: mean success over every episode of `mode` in `folders`}, and every step's invalid flag."""
    won: dict[str, list[float]] = defaultdict(list)
    invalid: list[bool] = []
    for folder in folders:
        for f in sorted(folder.glob(f"*/{mode}-s*.jsonl*")):
            text = gzip.decompress(f.read_bytes()).decode() if f.suffix == ".gz" else f.read_text()
            for line in text.splitlines():
                t = json.loads(line)
                won[t["game_id"]].append(float(t["won"]))
                invalid += [not s["valid"] for s in t["steps"]]
    return {g: sum(v) / len(v) for g, v in won.items()}, invalid


def interval(values: list[float], n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(values) for _ in values) / len(values) for _ in range(n_boot))
    return means[int(0.025 * n_boot)], means[int(0.975 * n_boot) - 1]


def summary(folders: list[Path], mode: str, against: Path | None = None) -> dict | None:
    rooms, invalid = per_room(folders, mode)
    if not rooms:
        return None
    values = list(rooms.values())
    lo, hi = interval(values)
    out = {"runs": len(folders), "rooms": len(rooms), "success": sum(values) / len(values), "lo": lo, "hi": hi}
    out["invalid_rate"] = sum(invalid) / len(invalid)
    if against is not None:
        start, _ = per_room([against], mode)
        if set(start) != set(rooms):
            raise SystemExit(f"{against} and the runs played different rooms ({mode})")
        diff = [rooms[g] - start[g] for g in rooms]
        dlo, dhi = interval(diff)
        out |= {"start": sum(start.values()) / len(start), "gain": sum(diff) / len(diff), "gain_lo": dlo}
        out["gain_hi"] = dhi
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    against = None
    if "--against" in args:
        i = args.index("--against")
        against, args = Path(args[i + 1]), args[:i] + args[i + 2 :]
    for mode in ("greedy", "sampled"):
        row = summary([Path(a) for a in args], mode, against)
        if row is not None:
            print(mode, json.dumps(row))
