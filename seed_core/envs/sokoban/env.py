"""Sokoban behind the environment protocol: rooms from seeds, manifests of seeds, expert steps from the solver.

A game id is a room's seed (decimal). Training seeds (train and warmup manifests) come from
`TRAIN_SEEDS`, evaluation seeds (valid_seen and valid_unseen) from the disjoint `EVAL_SEEDS`, so no
evaluation room is ever trained on; `valid_seen` and `valid_unseen` are both held-out rooms (Sokoban has no
seen/unseen scenes: two panels keep ALFWorld's report shape). A manifest line stores the sha256 of the
generated room, so a changed generator is refused instead of silently playing other rooms.

Steps cost microseconds, so the pool steps every room in this process (`env.workers` is not used).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tqdm import tqdm

from seed_core.envs import EnvState, GameEntry
from seed_core.envs.sokoban.prompts import PERCEPTION_PROMPT, SOKOBAN_PLAN_HINT, SOKOBAN_TASK, sokoban_step_prompt
from seed_core.envs.sokoban.room import (
    ACTIONS,
    GenerationError,
    Room,
    check_room_params,
    generate_room,
    grid_rgb,
    room_from_text,
    solve,
    step_labels,
)
from seed_core.records import DataError, Step, Trajectory, write_json
from seed_core.turns import completion, parse_response

TRAIN_SEEDS = range(0, 1_000_000)
EVAL_SEEDS = range(1_000_000, 2_000_000)
TASK_TYPE = "sokoban"
MANIFEST_SPLIT = {"train": "train", "warmup": "train", "valid_seen": "valid_seen", "valid_unseen": "valid_unseen"}
"""Each manifest's split; `train` seeds come from TRAIN_SEEDS, the others from EVAL_SEEDS."""


def seed_of(game_id: str) -> int:
    if not game_id.isdigit():
        raise DataError(f"Sokoban game id {game_id!r} is not a seed (a non-negative integer)")
    return int(game_id)


def seed_range(split: str) -> range:
    return TRAIN_SEEDS if split == "train" else EVAL_SEEDS


def think_text(room: Room, action: str) -> str:
    """The expert's one-line reasoning: whether the move pushes a box toward a target or walks into position."""
    (dr, dc), (r, c) = ACTIONS[action], room.player
    if (r + dr, c + dc) in room.boxes:
        return f"The box is {action} of me; pushing it {action} brings it closer to a target."
    return f"I walk {action} to get behind a box, on the side away from its target."


def step_example(game_id: str, room: Room, action: str, history: list[tuple[str, str]], env) -> dict:
    """One warm-up example: `room` after `history`, rendered as `rollout.play` renders it (in `env.observation`'s
    view; "observation" is the grid the step's image is drawn from), answered with `action`."""
    return {
        "prompt": sokoban_step_prompt(
            SOKOBAN_TASK, room.text(), list(ACTIONS), history, env.history_length, env.observation
        ),
        "completion": completion(think_text(room, action), action),
        "game_id": game_id,
        "step": len(history),
        "observation": room.text(),
    }


class SokobanPool:
    """Rooms by slot, stepped in this process; `reset` regenerates each room from its seed."""

    def __init__(self, dim: tuple[int, int], num_boxes: int):
        self.dim, self.num_boxes = dim, num_boxes
        self.rooms: dict[int, Room] = {}
        self._cache: dict[int, Room] = {}

    def room(self, seed: int) -> Room:
        if seed not in self._cache:
            self._cache[seed] = generate_room(seed, self.dim, self.num_boxes)
        return self._cache[seed]

    def _state(self, room: Room, reward: float = 0.0) -> EnvState:
        return EnvState(room.text(), list(ACTIONS), room.won, SOKOBAN_TASK, reward)

    def reset(self, game_ids: list[str]) -> list[EnvState]:
        self.rooms = {i: self.room(seed_of(g)) for i, g in enumerate(game_ids)}
        return [self._state(r) for r in self.rooms.values()]

    def step(self, actions: dict[int, str]) -> dict[int, EnvState]:
        out = {}
        for i, a in actions.items():
            self.rooms[i], reward, _ = self.rooms[i].step(a)
            out[i] = self._state(self.rooms[i], reward)
        return out

    def close(self) -> None:
        self.rooms = {}

    def __enter__(self) -> SokobanPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Sokoban:
    """The `Environment` of Sokoban rooms of size `dim` with `num_boxes` boxes."""

    name = "sokoban"
    task_types = {TASK_TYPE: TASK_TYPE}
    sdar_skills = "recipes/sdar_skills_sokoban.yaml"
    closed_actions = True  # verl-agent counts an unknown move as invalid and plays a no-op

    @classmethod
    def check_params(cls, params) -> None:
        from seed_core.config import ConfigError, require

        env = params.env
        try:
            check_room_params(env.sokoban.dim, env.sokoban.boxes)
        except GenerationError as e:  # its message names the key and what fits
            raise ConfigError(str(e)) from None
        if params.vision.composite:
            rows, cols = env.sokoban.dim
            fits = 16 * rows
            require(
                rows == cols and params.vision.image_size == fits,
                "vision.image_size",
                f"is {params.vision.image_size}, but a {rows}x{cols} room renders at 16 px per tile as "
                f"{16 * rows}x{16 * cols}; the composite needs a square room and image_size "
                f"{fits if rows == cols else '16 x side'}",
            )

    @classmethod
    def from_params(cls, params) -> Sokoban:
        return cls(tuple(params.env.sokoban.dim), params.env.sokoban.boxes)

    @staticmethod
    def step_prompt(env, task: str, observation: str, actions: list[str], history: list[tuple[str, str]]) -> str:
        return sokoban_step_prompt(task, observation, actions, history, env.history_length, env.observation)

    @staticmethod
    def render(env, observation: str):
        """The room's 16-px-per-tile rendering under an image view (`room.grid_rgb`); None under `text`."""
        return None if env.observation == "text" else grid_rgb(observation)

    def __init__(self, dim: tuple[int, int] = (6, 6), num_boxes: int = 1):
        self.dim, self.num_boxes = tuple(dim), num_boxes
        self._pool = SokobanPool(self.dim, num_boxes)  # a room cache shared by manifests and expert replay
        self._judge = None  # the oracle that replays episodes for `check_skill`, made on first use

    def write_manifests(self, cfg, manifest_dir: Path) -> dict[str, int]:
        """Seeded, sorted seed samples: train and warmup from TRAIN_SEEDS (disjoint), the validation panels
        from EVAL_SEEDS (disjoint)."""
        counts = {
            "train": cfg.train_games,
            "warmup": cfg.warmup_games,
            "valid_seen": cfg.valid_seen_games,
            "valid_unseen": cfg.valid_unseen_games,
        }
        for name, n in counts.items():
            if n < 0:
                raise DataError(
                    f"params: `prepare.{name}_games` is {n}; Sokoban needs a count >= 0 (rooms are unbounded)"
                )
        # one stream per seed range, and each sample a prefix of a longer one: more warm-up rooms leave the RL rooms
        # and every held-out room as they were, so starts calibrated with other sizes compare on the same rooms
        train = random.Random(f"sokoban-train-{cfg.seed}").sample(TRAIN_SEEDS, counts["train"] + counts["warmup"])
        evals = random.Random(f"sokoban-eval-{cfg.seed}").sample(
            EVAL_SEEDS, counts["valid_seen"] + counts["valid_unseen"]
        )
        chosen = {
            "train": train[: counts["train"]],
            "warmup": train[counts["train"] :],
            "valid_seen": evals[: counts["valid_seen"]],
            "valid_unseen": evals[counts["valid_seen"] :],
        }
        for name, seeds in chosen.items():
            entries = [
                GameEntry(str(s), MANIFEST_SPLIT[name], TASK_TYPE, self._pool.room(s).sha256()) for s in sorted(seeds)
            ]
            write_json(Path(manifest_dir) / f"{name}.json", {"games": [e.__dict__ for e in entries]})
        return counts

    def read_manifest(self, path: Path) -> list[GameEntry]:
        """The rooms of a manifest, each regenerated and checked against its recorded sha256 and seed range."""
        path = Path(path)
        if not path.exists():
            raise DataError(f"manifest {path} does not exist; run the prepare stage (`dvc repro prepare`)")
        entries = [GameEntry(**e) for e in json.loads(path.read_text())["games"]]
        for e in entries:
            seed, allowed = seed_of(e.game_id), seed_range(e.split)
            if seed not in allowed:
                raise DataError(
                    f"manifest {path}: seed {seed} of split {e.split!r} is outside its range "
                    f"[{allowed.start}, {allowed.stop}) (training and evaluation seeds must not overlap); "
                    "re-run prepare (`dvc repro prepare`)"
                )
            if self._pool.room(seed).sha256() != e.sha256:
                raise DataError(
                    f"Sokoban room {seed} of manifest {path} no longer matches its recorded sha256 (the generator "
                    f"or env.sokoban.dim={list(self.dim)} / env.sokoban.boxes={self.num_boxes} changed); "
                    "re-run prepare (`dvc repro prepare`)"
                )
        return entries

    def open_pool(self, workers: int) -> SokobanPool:
        return SokobanPool(self.dim, self.num_boxes)

    def _plans(self, entries: list[GameEntry], max_steps: int, progress: bool):
        """(game id, [(room, action)] along the solver's shortest plan) of each room it wins within `max_steps`."""
        for e in tqdm(entries, desc="expert plans", unit="room", disable=not progress):
            room = self._pool.room(seed_of(e.game_id))
            plan = solve(room)
            if plan is None or len(plan) > max_steps:
                continue
            path = []
            for action in plan:
                path.append((room, action))
                room, _, _ = room.step(action)
            if not room.won:  # the solver and the rules disagree: a bug, never a data problem
                raise RuntimeError(f"the solver's plan for room {e.game_id} does not win it")
            yield e.game_id, path

    def expert_examples(self, entries: list[GameEntry], env, progress: bool = True) -> list[dict]:
        """The solver's shortest plan of each room as step examples, rendered as `rollout.play` renders them (in
        `env.observation`'s view; "observation" is the grid the step's image is drawn from)."""
        examples: list[dict] = []
        for game_id, path in self._plans(entries, env.max_steps, progress):
            history: list[tuple[str, str]] = []
            for room, action in path:
                examples.append(step_example(game_id, room, action, history, env))
                history.append((room.text(), action))
        return examples

    def off_path_examples(
        self, entries: list[GameEntry], env, per_room: int, seed: int, progress: bool = True
    ) -> list[dict]:
        """`per_room` states of each room that its expert plan never visits, each with the solver's first move
        from it (DAgger's fix for behaviour cloning: a cloned policy that strays off the expert's path, as a bump
        into a wall does, has never seen where it is). A state is the end of a seeded random walk from the start
        (1 to env.max_steps // 2 moves, rendered with that walk as its history); it is kept when the room is still
        solvable and not won, and no expert or earlier state has it. Rooms whose plan is too long are skipped, as
        in `expert_examples`; a room with fewer such states within 50 walks per state gives fewer."""
        rng = random.Random(seed)
        moves = list(ACTIONS)
        examples: list[dict] = []
        for game_id, path in self._plans(entries, env.max_steps, progress):
            start = path[0][0]
            seen = {room.state_key() for room, _ in path}
            found = 0
            for _ in range(50 * per_room):
                if found == per_room:
                    break
                room, history = start, []
                for _ in range(rng.randint(1, max(1, env.max_steps // 2))):
                    action = rng.choice(moves)
                    history.append((room.text(), action))
                    room = room.moved(action)
                plan = solve(room)
                if not plan or room.state_key() in seen:
                    continue
                seen.add(room.state_key())
                found += 1
                examples.append(step_example(game_id, room, plan[0], history, env) | {"off_path": True})
        return examples

    def perception_examples(self, entries: list[GameEntry], env, progress: bool = True) -> list[dict]:
        """The perception warm-up's examples: every state on the solver's plan of each room, and the solved room,
        asked as PERCEPTION_PROMPT and answered with the grid text ("observation" is that grid)."""
        examples: list[dict] = []
        for game_id, path in self._plans(entries, env.max_steps, progress):
            last, action = path[-1]
            for t, room in enumerate([r for r, _ in path] + [last.step(action)[0]]):
                grid = room.text()
                examples.append(
                    {
                        "prompt": PERCEPTION_PROMPT,
                        "completion": grid,
                        "game_id": game_id,
                        "step": t,
                        "observation": grid,
                    }
                )
        return examples

    @staticmethod
    def plan_hint(observation: str) -> str | None:
        """The solver's shortest plan from the state `observation` shows, as a skill-block hint
        (SOKOBAN_PLAN_HINT); None when the room is won or lost."""
        plan = solve(room_from_text(observation))
        return SOKOBAN_PLAN_HINT.format(plan=", ".join(plan)) if plan else None

    @staticmethod
    def expert_trajectory(game_id: str, steps: list[dict]) -> Trajectory:
        """The won episode that the expert steps of one room (in order) make, as the oracle reads trajectories."""
        actions = [parse_response(x["completion"])[0] for x in sorted(steps, key=lambda x: x["step"])]
        return Trajectory(
            traj_id=f"expert:{game_id}", game_id=game_id, split="train", task_type=TASK_TYPE, task=SOKOBAN_TASK,
            group_id=f"expert:{game_id}", sample_idx=0, won=True, episode_return=0.0, length=len(actions),
            invalid_count=0, steps=[Step("", [], "", a, [], [], a, True, 0.0, "") for a in actions],
        )  # fmt: skip

    def oracle(self, max_chars: int | None = None, claims: str = "solver"):
        from seed_core.envs.sokoban.oracle import SokobanOracleTeacher

        return SokobanOracleTeacher(self.dim, self.num_boxes, max_chars, claims)

    def step_labels(self, traj) -> list[str]:
        """The solver's verdict on each step (`room.step_labels`); an invalid answer is the no-op it played."""
        actions = [s.action if s.valid else None for s in traj.steps]
        return step_labels(self._pool.room(seed_of(traj.game_id)), actions)

    def check_skill(self, traj, skill):
        """`oracle.check_skill` of the skill's summary and rule against the episode."""
        self._judge = self._judge or self.oracle()
        return self._judge.check_skill(traj, f"{skill.summary}\n{skill.skill}")

    def key_names(self, traj) -> list[str]:
        """The target cells, as the oracle's skills write them ("(3, 2)")."""
        return [f"({r}, {c})" for r, c in self._pool.room(seed_of(traj.game_id)).targets]

    def source(self) -> dict[str, str]:
        return {"sokoban_rooms": f"generated from seeds, dim {list(self.dim)}, {self.num_boxes} box(es)"}
