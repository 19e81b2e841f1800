"""Stage 1's held-out skills, checked against their rooms, with 95 % percentile bootstrap intervals over rooms.

Usage: python stage1_ci.py <sft_dir> <heldout.jsonl> [params.yaml]
Reads the held-out trajectories and the teacher's skills of `build_sft_data` (<sft_dir>), and the answers of the
starting model and the analyzer that `train_analyzer` wrote side by side (<heldout.jsonl>). For each of the three
sources it prints one JSON line:
- parse_rate: answers that parse;
- consistent: answers that parse, make a checkable claim and no false one (`Environment.check_skill`), as a
  share of all answers: a skill that parses but lies counts as a failure here;
- outcome_true, move_lists_true, facts_true: the shares of stated outcomes, move lists, and counts and step
  numbers that are true;
and `gain` (after minus before, paired per room) on the analyzer's line. `train_analyzer` reports the same
shares without intervals, and its `consistent` among parsed answers only.
"""

import json
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

from eval_ci import interval

from seed_core.config import load_params
from seed_core.envs import environment
from seed_core.method.skills import PARSED, parse_skill
from seed_core.records import Skill, Trajectory, read_jsonl


def share(rows: list[tuple[str, float]]) -> dict:
    """The mean of (room, value) rows, with its interval over rooms (each room's rows averaged first)."""
    by_room: dict[str, list[float]] = defaultdict(list)
    for game, x in rows:
        by_room[game].append(x)
    if not by_room:
        return {"n": 0}
    values = [sum(v) / len(v) for v in by_room.values()]
    lo, hi = interval(values)
    return {"n": len(rows), "mean": sum(x for _, x in rows) / len(rows), "lo": lo, "hi": hi}


def main(sft_dir: Path, heldout: Path, params_path: str = "params.yaml") -> None:
    env = environment(load_params(params_path))
    trajs = {t.traj_id: t for t in read_jsonl(sft_dir / "validation_trajectories.jsonl", Trajectory)}
    teacher = {s.traj_id: s for s in read_jsonl(sft_dir / "skills.jsonl", Skill) if s.traj_id in trajs}
    answers: dict[str, dict[str, SimpleNamespace | None]] = {"teacher": {}, "before": {}, "after": {}}
    for tid, s in teacher.items():
        answers["teacher"][tid] = (
            SimpleNamespace(summary=s.summary, skill=s.skill) if s.parse_status in PARSED else None
        )
    for row in map(json.loads, heldout.read_text().splitlines()):
        for tag in ("before", "after"):
            p = parse_skill(row[f"{tag}_raw"])
            answers[tag][row["traj_id"]] = SimpleNamespace(summary=p.summary, skill=p.skill) if p.ok else None
    consistent_of: dict[str, dict[str, float]] = {}
    for tag, by_traj in answers.items():
        parsed, consistent, outcomes, lists, facts = [], [], [], [], []
        for tid, ans in by_traj.items():
            game = trajs[tid].game_id
            check = env.check_skill(trajs[tid], ans) if ans is not None else None
            parsed.append((game, float(ans is not None)))
            consistent.append((game, float(check is not None and check.consistent)))
            if check is not None and check.outcome is not None:
                outcomes.append((game, float(check.outcome)))
            if check is not None:
                lists += [(game, float(i < check.move_lists_true)) for i in range(check.move_lists)]
                facts += [(game, float(i < check.facts_true)) for i in range(check.facts)]
        consistent_of[tag] = {tid: x for tid, (_, x) in zip(by_traj, consistent)}
        line = {"source": tag, "trajectories": len(by_traj), "rooms": len({g for g, _ in parsed})}
        line |= {"parse_rate": share(parsed), "consistent": share(consistent)}
        line |= {"outcome_true": share(outcomes), "move_lists_true": share(lists), "facts_true": share(facts)}
        if tag == "after":
            diff = [(trajs[t].game_id, x - consistent_of["before"][t]) for t, x in consistent_of["after"].items()]
            line["gain"] = share(diff)
        print(json.dumps(line))


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        raise SystemExit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:])
