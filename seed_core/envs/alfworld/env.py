"""ALFWorld text games, loaded exactly from a manifest and stepped in parallel by worker processes.

Each game is loaded on its own with `textworld.start` and ALFWorld's own wrappers (names demangled, no
shuffling), not through `AlfredTWEnv`, whose folder walk decides which games exist and in what order.
The initial observation is split into the task sentence (after "Your task is to: ") and the room
description; the welcome banner is dropped. `help` is removed from the admissible actions, as in the
verl-agent protocol.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from seed_core.envs import EnvState
from seed_core.envs.alfworld.data import game_path, import_alfworld, task_type_of

BANNER = "-= Welcome to TextWorld, ALFRED! =-"
TASK_MARKER = "Your task is to: "


def split_initial_observation(text: str) -> tuple[str, str]:
    """(room description, task sentence) from the first observation of a game."""
    text = text.replace(BANNER, "").strip()
    room, _, task = text.partition(TASK_MARKER)
    return room.strip(), task.strip()


# Engines of closed games, reused by the next game this process opens. textworld's PDDL engine loads a private
# copy of fast-downward's 33 MB library (a temp file, deleted once loaded: the planner keeps its state in globals)
# and cannot unload it (dlclose, then loading another copy, crashes), so a process that built an engine per game
# held 33 MB of disk and memory for every game it ever opened: a test session or a long run filled the disk.
# Reused, a process holds as many copies as it has games open at once. Loading a game sets all of its state.
_ENGINES: list[Any] = []


class AlfworldGame:
    """One ALFWorld game in this process."""

    def __init__(self, data_root: Path, game_id: str):
        import textworld

        import_alfworld()
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

        self.game_id = game_id
        self.task_type = task_type_of(game_id)
        self.path = game_path(data_root, game_id)
        if _ENGINES:
            self._env = _ENGINES.pop()
            self._env.load(str(self.path))  # all textworld.start does after building the engine
        else:
            infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
            self._env = textworld.start(
                str(self.path), request_infos=infos, wrappers=[AlfredDemangler(shuffle=False), AlfredInfos]
            )
        self.task = ""

    def walkthrough(self) -> list[str]:
        """The expert action sequence stored in the game file."""
        return list(json.loads(self.path.read_text())["walkthrough"])

    def _state(self, s: Any, observation: str) -> EnvState:
        actions = [a for a in s["admissible_commands"] if a != "help"]
        return EnvState(observation=observation, admissible_actions=actions, won=bool(s["won"]), task=self.task)

    def reset(self) -> EnvState:
        s = self._env.reset()
        room, self.task = split_initial_observation(s.feedback)
        return self._state(s, room)

    def step(self, action: str) -> EnvState:
        s, _, _ = self._env.step(action)
        return self._state(s, s.feedback.strip())

    def close(self) -> None:
        """End the game; its engine goes back to this process's stock for the next game to load into."""
        if self._env is not None:
            self._env.close()
            _ENGINES.append(self._env)
            self._env = None


class GameSlots:
    """The games of one process, by slot. Loading a game (PDDL parsing and grounding) costs about a second,
    so a game a slot leaves is kept idle and reused by the next reset of the same game id. At most as many
    games stay idle as there are slots (the least recently left are closed), so an eval that replays its
    games reuses them all while an RL run, which moves on to new games every update, holds a bounded set."""

    def __init__(self, data_root: Path):
        self.data_root = data_root
        self.by_slot: dict[int, AlfworldGame] = {}
        self.idle: dict[str, list[AlfworldGame]] = {}

    def reset(self, slot: int, game_id: str) -> EnvState:
        if slot in self.by_slot:
            old = self.by_slot.pop(slot)
            self.idle[old.game_id] = self.idle.pop(old.game_id, []) + [old]  # to the end: most recently left
        spare = self.idle.pop(game_id, [])
        self.by_slot[slot] = spare.pop() if spare else AlfworldGame(self.data_root, game_id)
        if spare:
            self.idle[game_id] = spare
        while sum(map(len, self.idle.values())) > len(self.by_slot):
            oldest = next(iter(self.idle))
            self.idle[oldest].pop(0).close()
            if not self.idle[oldest]:
                del self.idle[oldest]
        return self.by_slot[slot].reset()

    def step(self, slot: int, action: str) -> EnvState:
        return self.by_slot[slot].step(action)

    def close(self) -> None:
        for g in list(self.by_slot.values()) + [g for gs in self.idle.values() for g in gs]:
            g.close()
        self.by_slot, self.idle = {}, {}


def _worker(fd: int, data_root: str) -> None:
    conn, games = Connection(fd), GameSlots(Path(data_root))
    while True:
        try:
            cmd, slot, arg = conn.recv()
        except EOFError:  # the parent is gone without closing the pool
            return games.close()
        if cmd == "close":
            games.close()
            conn.send(("ok", None))
            return
        try:
            conn.send(("ok", games.reset(slot, arg) if cmd == "reset" else games.step(slot, arg)))
        except Exception as e:  # sent back and re-raised in the parent with the game named
            conn.send(("error", f"{type(e).__name__}: {e}"))


class EnvPool:
    """Many games at once. Slot i lives in worker i % workers; `workers=0` runs every game in-process.

    `reset(game_ids)` loads one game per slot; `step({slot: action})` steps the given slots concurrently and
    returns their new states. Workers are fresh interpreters that import this module only: a forked one would
    inherit torch's thread pools, a multiprocessing-spawned one re-imports the launching script first (a flow:
    Prefect, torch, transformers, vLLM; seconds of CPU per worker at every stage start).
    """

    def __init__(self, data_root: Path, workers: int):
        self.data_root = Path(data_root)
        self.workers = workers
        self._local = GameSlots(self.data_root)
        self._conns = []
        self._procs = []
        self.game_ids: list[str] = []
        for _ in range(workers):
            parent, child = socket.socketpair()
            code = f"from {__name__} import _worker; _worker({child.fileno()}, {str(self.data_root)!r})"
            self._procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", code],
                    pass_fds=[child.fileno()],
                    env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)),
                )
            )
            child.close()
            self._conns.append(Connection(parent.detach()))

    def _call(self, requests: dict[int, tuple[str, Any]]) -> dict[int, Any]:
        if self.workers == 0:
            return {
                slot: self._local.reset(slot, arg) if cmd == "reset" else self._local.step(slot, arg)
                for slot, (cmd, arg) in requests.items()
            }
        # Send every request first, then collect, so the workers run in parallel. A worker answers its
        # requests in order, so per worker the replies arrive in the order sent.
        per_worker: dict[int, list[int]] = {}
        for slot, (cmd, arg) in requests.items():
            w = slot % self.workers
            self._conns[w].send((cmd, slot, arg))
            per_worker.setdefault(w, []).append(slot)
        out = {}
        errors = []
        for w, slots in per_worker.items():
            for slot in slots:
                status, value = self._conns[w].recv()
                if status == "error":
                    errors.append(f"{self.game_ids[slot] if slot < len(self.game_ids) else slot}: {value}")
                out[slot] = value
        if errors:
            raise RuntimeError("environment worker failed: " + "; ".join(errors))
        return out

    def reset(self, game_ids: list[str]) -> list[EnvState]:
        self.game_ids = list(game_ids)
        out = self._call({i: ("reset", g) for i, g in enumerate(game_ids)})
        return [out[i] for i in range(len(game_ids))]

    def step(self, actions: dict[int, str]) -> dict[int, EnvState]:
        return self._call({slot: ("step", a) for slot, a in actions.items()})

    def close(self) -> None:
        for c in self._conns:
            c.send(("close", 0, None))
            c.recv()
        for p in self._procs:
            p.wait(timeout=10)
        self._local.close()
        self._conns, self._procs = [], []

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RayEnvPool(EnvPool):
    """`EnvPool` whose workers are Ray actors, for when environment CPU outgrows the GPU nodes: slot i lives in actor
    i % workers (one CPU each), which holds its games as an in-process pool does, so transcripts are EnvPool's. An
    actor runs its calls in the order sent, as a worker process does."""

    def __init__(self, data_root: Path, workers: int, address: str | None = None):
        import ray

        self.data_root, self.workers, self.game_ids = Path(data_root), workers, []
        if not ray.is_initialized():  # a private local cluster when no address is given
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        host = ray.remote(num_cpus=1)(GameSlots).options(
            runtime_env={"env_vars": {"ALFWORLD_DATA": str(self.data_root)}}
        )
        self._hosts = [host.remote(self.data_root) for _ in range(workers)]

    def _call(self, requests: dict[int, tuple[str, Any]]) -> dict[int, Any]:
        import ray

        refs = {
            slot: getattr(self._hosts[slot % self.workers], cmd).remote(slot, arg)
            for slot, (cmd, arg) in requests.items()
        }
        try:
            return dict(zip(refs, ray.get(list(refs.values()))))
        except ray.exceptions.RayError as e:
            raise RuntimeError(f"environment host (Ray actor) failed: {e}") from e

    def close(self) -> None:
        import ray

        ray.get([h.close.remote() for h in self._hosts])
        for h in self._hosts:
            ray.kill(h)
        self._hosts = []
