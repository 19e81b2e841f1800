"""A rollout with a tiny random-init model on real games writes complete records."""

from helpers import tiny_policy
from seed_core.config import EnvConfig, SamplingConfig
from seed_core.envs.alfworld.data import list_games, stratified_subset, write_manifest
from seed_core.envs.alfworld.env import EnvPool
from seed_core.records import Trajectory, read_jsonl, write_jsonl
from seed_core.rollout import play, summarize


def test_rollout_writes_complete_records(alfworld_root, base_model_dir, tmp_path):
    games = stratified_subset(list_games(alfworld_root, "valid_seen"), 2, seed=0)
    entries = write_manifest(tmp_path / "m.json", alfworld_root, games)
    policy = tiny_policy(base_model_dir, batch_size=4)
    env = EnvConfig(max_steps=3, history_length=2, workers=2)
    with EnvPool(alfworld_root, env.workers) as pool:
        trajs = play(
            policy, pool, entries, group_size=2, env=env, gen=SamplingConfig(max_new_tokens=6), seed=0, tag="t"
        )
    assert [(t.game_id, t.sample_idx) for t in trajs] == [(g, k) for g in games for k in range(2)]
    assert len({t.group_id for t in trajs}) == 2
    for t in trajs:
        # a random model never wins: every episode runs to max_steps, every step invalid
        assert not t.won and t.length == len(t.steps) == 3 and t.invalid_count == 3
        assert abs(t.episode_return + 0.3) < 1e-9
        assert t.task and t.task_type in t.game_id
        for k, s in enumerate(t.steps):
            # random tokens never close </action> (nor hit EOS at this seed): every response runs to the cap
            assert len(s.response_ids) == len(s.response_logprobs) == 6
            assert all(-30.0 < lp <= 0.0 for lp in s.response_logprobs)  # log-probs of sampled tokens
            assert s.prompt.startswith("You are an expert agent") and f"Your task is to: {t.task}" in s.prompt
            assert s.reward == -0.1 and s.feedback == "Nothing happens." and s.admissible_actions
            if k:
                assert f"you have already taken {k} step(s)" in s.prompt
                assert s.observation == t.steps[k - 1].feedback
    write_jsonl(tmp_path / "t.jsonl", trajs)
    assert list(read_jsonl(tmp_path / "t.jsonl", Trajectory)) == trajs
    assert summarize(trajs)["invalid_rate"] == 1.0
