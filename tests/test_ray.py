"""Ray for scale-out: ALFWorld's workers as Ray actors on a local cluster (loopback only) give EnvPool's transcripts."""

from __future__ import annotations

import pytest

from seed_core.config import params_from_dict
from seed_core.envs import environment
from seed_core.envs.alfworld.data import list_games, stratified_subset
from seed_core.envs.alfworld.env import EnvPool, RayEnvPool

ray = pytest.importorskip("ray", reason="ray is a project dependency: run `make install`")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
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
    env = environment(params_from_dict({"data": {"alfworld_data": str(alfworld_root)}, "env": {"hosts": "ray"}}))
    with env.open_pool(2) as pool:
        assert isinstance(pool, RayEnvPool)
