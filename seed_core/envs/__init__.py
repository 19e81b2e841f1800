"""Environments behind one protocol: a pool of games, reset by game id and stepped with action strings.

Stages and the method see only what is here: `GameEntry` (a manifest line), `EnvState` (what the agent
observes), `GamePool` (many games stepped together), and `open_pool`, the one place that picks the
environment. ALFWorld lives in `envs/alfworld/` (data, env, oracle, expert replay).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


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


class GamePool(Protocol):
    """Many games at once, one per slot; `step` advances the given slots concurrently."""

    def reset(self, game_ids: list[str]) -> list[EnvState]: ...

    def step(self, actions: dict[int, str]) -> dict[int, EnvState]: ...

    def close(self) -> None: ...

    def __enter__(self) -> GamePool: ...

    def __exit__(self, *exc) -> None: ...


def open_pool(data_root: Path, workers: int) -> GamePool:
    """A pool of the configured environment's games (ALFWorld, from `data_root`); `workers` processes step them
    (0: in this process)."""
    from seed_core.envs.alfworld.env import EnvPool

    return EnvPool(data_root, workers)
