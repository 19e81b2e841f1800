"""Environments behind one protocol: a pool of games, reset by game id and stepped with action strings.

Stages and the method see only what is here: `GameEntry` (a manifest line), `EnvState` (what the agent
observes), `GamePool` (many games stepped together), `Environment` (manifests, pools, expert steps and the
oracle teacher of one environment) and `environment(params)`, the one place that picks it by `env.name`.
ALFWorld lives in `envs/alfworld/` (real game files), Sokoban in `envs/sokoban/` (rooms from seeds).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from seed_core.config import EnvConfig, Params, PrepareConfig
    from seed_core.records import Skill, Trajectory

TASK_SHORT = {
    "pick_and_place_simple": "pick",
    "look_at_obj_in_light": "look",
    "pick_clean_then_place_in_recep": "clean",
    "pick_heat_then_place_in_recep": "heat",
    "pick_cool_then_place_in_recep": "cool",
    "pick_two_obj_and_place": "pick2",
    "sokoban": "sokoban",
}
"""Every environment's task types in table order, with their column names (ALFWorld's are the paper's)."""
TASK_TYPES = tuple(TASK_SHORT)
ENV_TASK_TYPES = {"alfworld": TASK_TYPES[:6], "sokoban": ("sokoban",)}


def table_task_types(keys) -> list[str]:
    """The task-type columns for results with metric `keys`: every type of each environment that has one."""
    return [t for types in ENV_TASK_TYPES.values() if any(f"success/{t}" in keys for t in types) for t in types]


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
    """What the stages need from one environment; `environment(params)` returns the configured one."""

    name: str

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

    def source(self) -> dict[str, str]:
        """External inputs for the lineage (where the games come from)."""
        ...


def observation_image(env: EnvConfig, observation: str):
    """The image the agent sees with `observation` under `env.observation` ((H, W, 3) uint8), or None for text:
    steps store the grid text and the image is redrawn from it whenever it is sampled, scored or trained on."""
    if env.observation == "text":
        return None
    from seed_core.envs.sokoban.room import grid_rgb

    return grid_rgb(observation)


def environment(params: Params) -> Environment:
    """The environment named by `env.name`."""
    name = params.env.name
    if name == "alfworld":
        from seed_core.envs.alfworld import Alfworld

        return Alfworld(params.data.alfworld_data, params.env.hosts, params.env.ray_address)
    if name == "sokoban":
        from seed_core.envs.sokoban.env import Sokoban

        return Sokoban(tuple(params.env.sokoban_dim), params.env.sokoban_boxes)
    raise ValueError(f"params: `env.name` is {name!r}; allowed: ['alfworld', 'sokoban']")
