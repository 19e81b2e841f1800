"""Held-out success of an `evaluate` run with a 95 % percentile bootstrap interval over rooms, per decoding mode.

Usage: python eval_ci.py data/eval/<model>   (reads <split>/<mode>-s<seed>.jsonl; prints one JSON line per mode)
Used for the figures in this folder: `evaluate` itself reports success without an interval.
"""

import json
import random
import sys
from collections import defaultdict
from pathlib import Path


def summary(files: list[Path], n_boot: int = 2000, seed: int = 0) -> dict:
    won: dict[str, list[float]] = defaultdict(list)
    invalid: list[bool] = []
    for f in files:
        for line in f.read_text().splitlines():
            t = json.loads(line)
            won[t["game_id"]].append(float(t["won"]))
            invalid += [not s["valid"] for s in t["steps"]]
    rooms = [sum(v) / len(v) for v in won.values()]
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(rooms) for _ in rooms) / len(rooms) for _ in range(n_boot))
    return {
        "rooms": len(rooms),
        "wins": sum(rooms),
        "success": sum(rooms) / len(rooms),
        "lo": means[int(0.025 * n_boot)],
        "hi": means[int(0.975 * n_boot) - 1],
        "invalid_rate": sum(invalid) / len(invalid),
    }


if __name__ == "__main__":
    for mode in ("greedy", "sampled"):
        files = sorted(Path(sys.argv[1]).glob(f"*/{mode}-s*.jsonl"))
        if files:
            print(mode, json.dumps(summary(files)))
