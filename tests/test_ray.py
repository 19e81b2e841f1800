"""Ray for scale-out, on a local cluster bound to loopback: ALFWorld's workers as Ray actors give EnvPool's
transcripts, and `rl.launcher: ray` runs the RL stage's rank program on Ray Train workers (gloo)."""

from __future__ import annotations

import json

import pytest

from seed_core.config import params_from_dict
from seed_core.envs import environment
from seed_core.envs.alfworld.data import list_games, stratified_subset, write_manifest
from seed_core.envs.alfworld.env import EnvPool, RayEnvPool
from seed_core.stages.rl import run_folder_name, train, write_outputs

pytestmark = pytest.mark.e2e  # a local Ray cluster

ray = pytest.importorskip("ray", reason="ray is a project dependency: run `make install`")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """4 logical CPUs: two Ray Train workers and two game hosts at once."""
    ray.init(num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1",
             _temp_dir=str(tmp_path_factory.mktemp("ray")), log_to_driver=False)  # fmt: skip
    yield
    ray.shutdown()


def transcript(pool, games: list[str]) -> list:
    """Reset both games on three slots, then step every slot through the same actions."""
    out = [pool.reset(games + games[:1])]
    for action in ("look", "inventory", "examine countertop 1", "go to countertop 1"):
        out.append(pool.step({slot: action for slot in range(3)}))
    return out


def test_ray_actor_pool_gives_envpool_transcripts(alfworld_root, cluster):
    games = stratified_subset(list_games(alfworld_root, "valid_seen"), 2, seed=0)
    with EnvPool(alfworld_root, 2) as pool:
        expected = transcript(pool, games)
    with RayEnvPool(alfworld_root, 2) as pool:
        got = transcript(pool, games)
    assert got == expected
    assert len({s.observation for s in expected[0]}) == 2  # two different games


def test_env_hosts_ray_opens_the_actor_pool(alfworld_root, cluster):
    env = environment(
        params_from_dict({"data": {"alfworld_data": str(alfworld_root)}, "env": {"alfworld": {"hosts": "ray"}}})
    )
    with env.open_pool(2) as pool:
        assert isinstance(pool, RayEnvPool)


def test_ray_train_runs_the_rank_program_to_the_stage_outputs(alfworld_root, tiny_model_dir, tmp_path, cluster):
    games = stratified_subset(list_games(alfworld_root, "valid_seen"), 2, seed=0)
    mdir = tmp_path / "manifests"
    for name in ("train", "valid_seen"):
        write_manifest(mdir / f"{name}.json", alfworld_root, games)
    raw = {
        "env": {"max_steps": 2, "workers": 0},
        "rollout": {"max_new_tokens": 5, "batch_size": 8},
        "rl": {"launcher": "ray", "world_size": 2, "games_per_update": 2, "group_size": 2, "epochs": 1,
               "updates_per_epoch": 1, "validation_games": 2, "analyzer_max_new_tokens": 8},
    }  # fmt: skip
    (tmp_path / "params.yaml").write_text(json.dumps(raw))
    p = params_from_dict(raw)
    run_dir = tmp_path / "runs" / run_folder_name(p, tiny_model_dir)
    summaries = [train_it() for _, train_it in train(p, tmp_path / "params.yaml", tiny_model_dir, mdir, run_dir)]
    assert [s["epoch"] for s in summaries] == [1]
    # 5 new tokens cannot hold "<action>...</action>": every step is invalid and no game is won
    assert summaries[0]["rollout/invalid_rate"] == 1.0 and summaries[0]["rollout/success_rate"] == 0.0
    assert "val/success_rate" in summaries[0]
    corpus = [json.loads(line) for line in (run_dir / "epoch_001" / "skills.jsonl").read_text().splitlines()]
    assert len(corpus) == 4  # both ranks' trajectories: 2 games x 2 episodes
    assert all(c["trajectory"]["invalid_count"] == c["trajectory"]["length"] == 2 for c in corpus)
    summary = write_outputs(p, tiny_model_dir, run_dir, tmp_path / "final", tmp_path / "rl.json", tmp_path / "u.json")
    assert summary["updates"] == 1 and (tmp_path / "final" / "model.safetensors").exists()
