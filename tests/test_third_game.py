"""Adding a game is one class and one registration line: a corridor defined here, registered in `envs.GAMES`, runs
one RL update with every method through the real stage code (RLRun), the tiny model sampling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import ONE_UPDATE
from seed_core.config import METHODS, params_from_dict
from seed_core.envs import GAMES, EnvState, GameEntry, environment, game, task_columns
from seed_core.method.teachers import TeacherStats, budgeted_answer, oracle_answers
from seed_core.records import write_json
from seed_core.stages.rl import RLRun
from seed_core.turns import TASK_LINE_PREFIX, completion, format_actions

LENGTH = 3  # cells; the agent starts in the first and wins in the last
ACTIONS = ["left", "right"]


class CorridorPool:
    def __init__(self):
        self.at: dict[int, int] = {}

    def _state(self, i: int) -> EnvState:
        return EnvState(f"You are in cell {self.at[i]} of {LENGTH}.", list(ACTIONS), self.at[i] == LENGTH - 1, "walk")

    def reset(self, game_ids):
        self.at = dict.fromkeys(range(len(game_ids)), 0)
        return [self._state(i) for i in self.at]

    def step(self, actions):
        for i, a in actions.items():
            self.at[i] = min(LENGTH - 1, max(0, self.at[i] + {"left": -1, "right": 1}.get(a, 0)))
        return {i: self._state(i) for i in actions}

    def close(self):
        self.at = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class CorridorOracle:
    """The oracle teacher: it knows the way is right."""

    name = "oracle:corridor"

    def __init__(self, max_chars):
        self.max_chars, self.stats = max_chars, TeacherStats()

    def analyze_trajectory(self, traj) -> str:
        lefts = sum(s.action == "left" for s in traj.steps)
        summary = [f"{'Won' if traj.won else 'Lost'} after {traj.length} step(s), {lefts} of them left."]
        return json.dumps(budgeted_answer(summary, ["Always walk right: the end is to the right."], self.max_chars))

    def complete_trajectories(self, trajs):
        return oracle_answers(self, trajs)

    def complete_batch(self, prompts):
        raise AssertionError("the oracle reads trajectories, not prompts")


class Corridor:
    name = "corridor"
    task_types = {"walk": "walk"}
    sdar_skills = None  # the test's params name one
    closed_actions = True

    @classmethod
    def check_params(cls, params):
        pass

    @classmethod
    def from_params(cls, params):
        return cls()

    @staticmethod
    def step_prompt(env, task, observation, actions, history):
        return (
            f"You walk a corridor.\n{TASK_LINE_PREFIX}{task}\nYou took {len(history)} step(s). {observation}\n"
            f"Actions: [{format_actions(actions)}]. Answer with <think>...</think> then <action>...</action>."
        )

    @staticmethod
    def render(env, observation):
        return None

    def write_manifests(self, cfg, manifest_dir: Path) -> dict[str, int]:
        counts = {"train": cfg.train_games, "warmup": 0, "valid_seen": 1, "valid_unseen": 1}
        for name, n in counts.items():
            write_json(Path(manifest_dir) / f"{name}.json", [f"{name}-{k}" for k in range(n)])
        return counts

    def read_manifest(self, path: Path) -> list[GameEntry]:
        return [GameEntry(g, Path(path).stem, "walk", "") for g in json.loads(Path(path).read_text())]

    def open_pool(self, workers: int):
        return CorridorPool()

    def expert_examples(self, entries, env, progress=True):
        return [
            {"prompt": self.step_prompt(env, "walk", f"You are in cell {k} of {LENGTH}.", ACTIONS, [("", "right")] * k),
             "completion": completion("The end is right.", "right"), "game_id": e.game_id, "step": k}
            for e in entries for k in range(LENGTH - 1)
        ]  # fmt: skip

    def oracle(self, max_chars=None, claims="solver"):
        return CorridorOracle(max_chars)

    def step_labels(self, traj):
        return ["optimal" if s.valid and s.action == "right" else "wasted" for s in traj.steps]

    def check_skill(self, traj, skill):
        return None

    def key_names(self, traj):
        return []

    def perception_examples(self, entries, env, progress=True):
        raise ValueError("the corridor shows no images")

    def source(self):
        return {"corridor": f"{LENGTH} cells"}


@pytest.fixture
def corridor(monkeypatch):
    monkeypatch.setitem(GAMES, "corridor", Corridor)  # the one registration line
    yield


def corridor_params(method: str, tmp_path: Path):
    (tmp_path / "sdar.yaml").write_text("walk: Walk right until the corridor ends.\n")
    return params_from_dict(
        {
            "env": {"name": "corridor", "max_steps": 2, "workers": 0},
            "prepare": {"train_games": 2},
            "model": {"dtype": "float32"},
            "rollout": {"max_new_tokens": 12, "batch_size": 8, "backend": "hf"},
            "rl": {"method": method, **ONE_UPDATE, "sdar_skills": str(tmp_path / "sdar.yaml")},
        }  # fmt: skip
    )


def test_the_registry_finds_the_game_by_name(corridor, tmp_path):
    p = corridor_params("grpo", tmp_path)
    assert game("corridor") is Corridor and isinstance(environment(p), Corridor)
    assert list(task_columns())[-1] == "walk"  # the game's columns join the results tables
    with pytest.raises(
        ValueError, match=r"`env.name` must be one of \['alfworld', 'corridor', 'sokoban'\], got 'maze'"
    ):
        game("maze")


@pytest.mark.parametrize("method", METHODS)
def test_one_rl_update_with_every_method_on_a_third_game(method, corridor, tiny_model_dir, tmp_path):
    p = corridor_params(method, tmp_path)
    environment(p).write_manifests(p.prepare, tmp_path / "m")
    run = RLRun(p, tiny_model_dir, tmp_path / "m", tmp_path / "run")
    before = {k: v.detach().clone() for k, v in run.trainer.model.named_parameters() if v.requires_grad}
    out = run.run_epoch(1)
    run.pool.close()
    changed = any(not torch.equal(before[k], v) for k, v in run.trainer.model.named_parameters() if v.requires_grad)

    assert out["rollout/episode_length"] == 2 and "val/success_rate" in out and "loss/pg" in out
    # the game's labels reach the credit probe: the tiny model answers invalidly, so every step is wasted
    assert out["credit/optimal_frac"] == 0.0
    skills = [json.loads(x) for x in (tmp_path / "run" / "epoch_001" / "skills.jsonl").read_text().splitlines()]
    assert len(skills) == (0 if method == "grpo" else 4)
    assert all([s["label"] for s in x["rescore"]["steps"]] == ["wasted"] * 2 for x in skills)
    if method in (
        "sdar",
        "seed_oracle",
    ):  # skills that parse put a skill block in the game's prompt and move the weights
        assert out["opd/active_token_ratio"] > 0 and changed
        assert all("right" in x["skill"].lower() for x in skills)
