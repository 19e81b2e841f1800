"""Games behind one protocol: a pool of games, reset by game id and stepped with action strings.

Stages and the method see only what is here: `GameEntry` (a manifest line), `EnvState` (what the agent
observes), `GamePool` (many games stepped together), `Environment` (everything one game owns: its task types,
step prompt, action set, renderer, manifests, pools, expert steps, oracle teacher and solver, its parameter
checks) and `GAMES`, the registry `env.name` picks from. ALFWorld lives in `envs/alfworld/` (real game files),
Sokoban in `envs/sokoban/` (rooms from seeds). Adding a game: a package under `envs/` with a class that satisfies
`Environment`, one line in `GAMES`, a recipe. A game imports nothing of the method layer but the teacher protocol
its oracle implements (`method/teachers.py`).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    import numpy as np

    from seed_core.config import EnvConfig, Params, PrepareConfig
    from seed_core.records import Skill, Trajectory

GAMES: dict[str, str | type[Environment]] = {
    "alfworld": "seed_core.envs.alfworld:Alfworld",
    "sokoban": "seed_core.envs.sokoban.env:Sokoban",
}
"""`env.name` -> its `Environment` class, or "module:Class" imported on first use (a run imports only its game)."""


@dataclass(frozen=True)
class GameEntry:
    """One game of a task manifest (written by `prepare`; later stages read games only from manifests)."""

    game_id: str
    split: str
    task_type: str
    sha256: str  # of the game file, checked when the manifest is read


@dataclass
class EnvState:
    observation: str
    admissible_actions: list[str]
    won: bool
    task: str = ""
    reward: float = 0.0  # the environment's own shaping of this step; the rollout adds the win reward and penalties


class GamePool(Protocol):
    """Many games at once, one per slot; `step` advances the given slots concurrently."""

    def reset(self, game_ids: list[str]) -> list[EnvState]: ...

    def step(self, actions: dict[int, str]) -> dict[int, EnvState]: ...

    def close(self) -> None: ...

    def __enter__(self) -> GamePool: ...

    def __exit__(self, *exc) -> None: ...


class Environment(Protocol):
    """Everything one game owns. `environment(params)` returns the configured one; the class-level facts serve
    callers that hold only `env` (an EnvConfig): `game(env.name).step_prompt(...)`."""

    name: ClassVar[str]
    task_types: ClassVar[dict[str, str]]
    """Its task types in table order, each with its column name in results tables (ALFWorld's are the paper's)."""
    sdar_skills: ClassVar[str | None]
    """Its hand-written skill per task type for the SDAR baseline (a YAML file; `rl.sdar_skills` null reads it)."""
    closed_actions: ClassVar[bool]
    """Whether a well-formatted response must also name an admissible action to be valid: verl-agent counts an
    unknown Sokoban move as invalid (and plays a no-op), while ALFWorld answers an inadmissible command itself."""

    @classmethod
    def check_params(cls, params: Params) -> None:
        """Refuse parameters this game cannot run (`config.ConfigError` naming the key and the fix), before any work:
        the sizes of its splits, its own `env.*` keys, what it cannot render or leave out."""
        ...

    @classmethod
    def from_params(cls, params: Params) -> Environment:
        """The game as `params` configure it."""
        ...

    @staticmethod
    def step_prompt(
        env: EnvConfig, task: str, observation: str, actions: list[str], history: list[tuple[str, str]]
    ) -> str:
        """The user message of one step: `history` holds every (observation, action) pair so far, oldest first
        (the prompt shows the last `env.history_length`). It must hold one line `turns.TASK_LINE_PREFIX + task`:
        SEED's skill block goes after it."""
        ...

    @staticmethod
    def render(env: EnvConfig, observation: str) -> np.ndarray | None:
        """The image the agent sees with `observation` under `env.observation` ((H, W, 3) uint8), or None for text:
        steps store the observation text and the image is redrawn from it whenever it is sampled, scored or
        trained on."""
        ...

    def write_manifests(self, cfg: PrepareConfig, manifest_dir: Path) -> dict[str, int]:
        """Check the game source, write train/warmup/valid_seen/valid_unseen manifests; games per manifest."""
        ...

    def read_manifest(self, path: Path) -> list[GameEntry]: ...

    def open_pool(self, workers: int) -> GamePool: ...

    def expert_examples(self, entries: list[GameEntry], env: EnvConfig, progress: bool = True) -> list[dict]:
        """Expert (prompt, completion) steps rendered as `rollout.play` renders them: {"prompt", "completion",
        "game_id", "step"}; a game the expert cannot win within `env.max_steps` contributes nothing."""
        ...

    def oracle(self, max_chars: int | None = None, claims: str = "solver"):
        """The oracle teacher: hindsight skills from trajectories (`complete_trajectories`); `claims`
        (`teacher.oracle_claims`) other than `solver` only where the environment has a solver to leave out."""
        ...

    def step_labels(self, traj: Trajectory) -> list[str] | None:
        """The solver's verdict on each step of `traj` (`optimal`, `wasted`, `fatal`, `lost`: Sokoban's
        `room.step_labels`), the ground truth of the credit probe; None where the environment has no solver."""
        ...

    def check_skill(self, traj: Trajectory, skill: Skill):
        """What a parsed skill claims about `traj` (its outcome, the moves it lists, the counts it states), checked
        against the episode and the solver: an object with `consistent`, `outcome`, `move_lists`, `move_lists_true`,
        `facts`, `facts_true` (Sokoban's `oracle.SkillCheck`); None where the environment has no solver."""
        ...

    def key_names(self, traj: Trajectory) -> list[str]:
        """Names a good skill for `traj` should mention (ALFWorld: where the target object starts)."""
        ...

    def perception_examples(self, entries: list[GameEntry], env: EnvConfig, progress: bool = True) -> list[dict]:
        """The perception warm-up's examples of a game with images: {"prompt" (with its IMAGE_MARK), "completion",
        "game_id", "step", "observation"} (the image is `render(env, observation)`)."""
        ...

    def source(self) -> dict[str, str]:
        """External inputs for the lineage (where the games come from)."""
        ...


def game(name: str) -> type[Environment]:
    """The `Environment` class registered as `name` in `GAMES`."""
    if name not in GAMES:
        raise ValueError(f"params: `env.name` must be one of {sorted(GAMES)}, got {name!r}")
    entry = GAMES[name]
    if isinstance(entry, str):
        module, _, cls = entry.partition(":")
        entry = GAMES[name] = getattr(importlib.import_module(module), cls)
    return entry


def environment(params: Params) -> Environment:
    """The game `env.name` names, as `params` configure it."""
    return game(params.env.name).from_params(params)


def observation_image(env: EnvConfig, observation: str):
    """`render` of the game `env.name` names: the image the agent sees with `observation`, or None for text."""
    return game(env.name).render(env, observation)


def task_columns() -> dict[str, str]:
    """Every registered game's task types in table order, each with its column name."""
    return {t: short for name in GAMES for t, short in game(name).task_types.items()}


def table_task_types(keys: Iterable[str]) -> list[str]:
    """The task-type columns for results with metric `keys`: every type of each game that has one."""
    keys = set(keys)
    groups = [list(game(name).task_types) for name in GAMES]
    return [t for types in groups if any(f"success/{t}" in keys for t in types) for t in types]
