"""The RL update on a fixed batch with a tiny model, the method switch, and resume."""

import dataclasses
import json

import pytest
import torch

from seed_core.config import params_from_dict
from seed_core.envs.alfworld.data import list_games, stratified_subset, write_manifest
from seed_core.envs.alfworld.env import EnvPool
from seed_core.method.prompts import inject_skill
from seed_core.method.rescore import step_tokens
from seed_core.method.update import NonFiniteError, Trainer, method_spec, shuffle_skills
from seed_core.models import load_model
from seed_core.records import Skill
from seed_core.rollout import play
from seed_core.stages.rl import RLRun

SMALL = {
    "env": {"max_steps": 2, "workers": 0},
    "rollout": {"max_new_tokens": 5, "batch_size": 8},
    "rl": {
        "epochs": 2,
        "updates_per_epoch": 1,
        "games_per_update": 1,
        "group_size": 2,
        "validation_games": 1,
        "analyzer_max_new_tokens": 8,
        "learning_rate": 0.01,
        "mini_batch_steps": 64,
    },
}


def params(**rl):
    raw = json.loads(json.dumps(SMALL))
    raw["rl"].update(rl)
    return params_from_dict(raw)


@pytest.fixture(scope="module")
def fixed_batch(alfworld_root, tiny_model_dir, tmp_path_factory):
    """Two real games x 2 episodes from the tiny model; one episode relabelled as a win so advantages differ."""
    games = stratified_subset(list_games(alfworld_root, "valid_seen"), 2, seed=0)
    entries = write_manifest(tmp_path_factory.mktemp("m") / "m.json", alfworld_root, games)
    p = params()
    model, tok = load_model(tiny_model_dir)
    trainer = Trainer(model, tok, p)
    with EnvPool(alfworld_root, 0) as pool:
        trajs = play(
            trainer.policy, pool, entries, group_size=2, env=p.env, gen=p.rollout, seed=0, tag="t", progress=False
        )
    trajs[0] = dataclasses.replace(trajs[0], won=True, episode_return=10.0)
    return trajs


def skills_for(trajs, ok=(True, True, True, True)):
    return [
        Skill(
            t.traj_id,
            t.game_id,
            t.task_type,
            "failure",
            "s",
            "look first, then take the object" if good else "",
            "ok" if good else "failed",
            "",
            "test",
            "h",
        )
        for t, good in zip(trajs, ok)
    ]


def trainer_for(tiny_model_dir, **rl):
    model, tok = load_model(tiny_model_dir)
    return Trainer(model, tok, params(**rl))


def weights(trainer):
    return {k: v.detach().clone() for k, v in trainer.model.named_parameters() if v.requires_grad}


@pytest.mark.fault("params")
def test_unknown_method_lists_the_valid_ones():
    with pytest.raises(
        ValueError, match="unknown rl.method 'ppo'; valid: grpo, seed, grpo_opsd, sdar, seed_shuffled, seed_oracle"
    ):
        method_spec("ppo")


def test_shuffled_skills_move_to_the_next_game_in_order(fixed_batch):
    a1, a2, b1, b2 = fixed_batch  # 2 games x 2 episodes
    assert a1.game_id == a2.game_id != b1.game_id == b2.game_id
    skills = [
        dataclasses.replace(s, skill=f"written for {t.traj_id}") for s, t in zip(skills_for(fixed_batch), fixed_batch)
    ]
    skills[3] = None
    moved = shuffle_skills(fixed_batch, skills)
    assert [m.skill if m else None for m in moved] == [
        f"written for {b1.traj_id}",
        None,
        f"written for {a1.traj_id}",
        f"written for {a2.traj_id}",
    ]
    assert [m.traj_id for m in moved if m] == [a1.traj_id, b1.traj_id, b2.traj_id]
    assert moved[0].producer == f"shuffled:{b1.traj_id}" and moved[0].game_id == a1.game_id
    with pytest.raises(ValueError, match="needs at least 2 games per update .*raise rl.games_per_update"):
        shuffle_skills([a1, a2], skills[:2])


def test_skill_context_and_identical_response_tokens(fixed_batch, tiny_model_dir):
    trainer = trainer_for(tiny_model_dir)
    skills = ["look first", None, "take it", None]
    steps = step_tokens(trainer.policy.encoder, fixed_batch, skills)
    assert len(steps) == sum(t.length for t in fixed_batch)
    for s in steps:
        step = fixed_batch[s.traj].steps[s.step]
        assert s.response_ids == step.response_ids
        assert s.prompt_ids == trainer.policy.encoder.encode_prompt(step.prompt)
        if skills[s.traj] is None:
            assert s.teacher_ids is None
        else:
            assert s.teacher_ids == trainer.policy.encoder.encode_full(inject_skill(step.prompt, skills[s.traj]))
            text = trainer.policy.tok.decode(s.teacher_ids)
            assert (
                text.index("Your task is to:")
                < text.index("**Episode-Level Skill**")
                < text.index("Your admissible actions")
            )


def test_lambda_zero_seed_update_is_bit_identical_to_grpo(fixed_batch, tiny_model_dir):
    grpo = trainer_for(tiny_model_dir, method="grpo")
    seed0 = trainer_for(tiny_model_dir, method="seed", opd_lambda=0.0)
    grpo.learn(fixed_batch, 0)
    m, _ = seed0.learn(fixed_batch, 0, skills=skills_for(fixed_batch))
    assert m["opd/active_token_ratio"] == 1.0  # OPD was computed, with weight 0
    a, b = weights(grpo), weights(seed0)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    seed = trainer_for(tiny_model_dir, method="seed", opd_lambda=1.0)
    seed.learn(fixed_batch, 0, skills=skills_for(fixed_batch))
    assert any(not torch.equal(a[k], v) for k, v in weights(seed).items())


def test_opd_masked_exactly_for_failed_analyses(fixed_batch, tiny_model_dir):
    trainer = trainer_for(tiny_model_dir, method="seed")
    ok = (True, False, False, True)
    skills = skills_for(fixed_batch, ok)
    batch = trainer.build_batch(fixed_batch, skills)
    for s, lp in zip(batch.steps, batch.teacher_logp):
        assert (lp is not None) == ok[s.traj]
    tokens = {i: sum(len(s.response_ids) for s in batch.steps if s.traj == i) for i in range(4)}
    # The corpus's Δ is teacher - pi_old (the weights before the update), its gate the method's own sigmoid(5 Δ).
    with torch.no_grad():
        old = trainer.policy.score_batch([s.prompt_ids for s in batch.steps], [s.response_ids for s in batch.steps])
    deltas = {
        i: torch.cat([t - o for s, t, o in zip(batch.steps, batch.teacher_logp, old) if s.traj == i])
        for i in range(4)
        if ok[i]
    }
    m, corpus = trainer.learn(fixed_batch, 0, skills=skills)
    active = sum(n for i, n in tokens.items() if ok[i])
    assert m["opd/active_token_ratio"] == pytest.approx(active / sum(tokens.values()))
    assert [c["parse_status"] for c in corpus] == ["ok", "failed", "failed", "ok"]
    for i, (c, good) in enumerate(zip(corpus, ok)):
        assert c["rescore"]["tokens"] == (tokens[i] if good else 0)
        assert c["trajectory"]["actions"] == [s.action for s in fixed_batch[i].steps]
        if good:
            assert c["rescore"]["delta_mean"] == pytest.approx(deltas[i].mean().item(), abs=1e-5)
            assert c["rescore"]["gate_mean"] == pytest.approx(torch.sigmoid(5.0 * deltas[i]).mean().item(), abs=1e-5)


def test_on_policy_update_skips_the_old_logp_pass_and_trains_the_same(fixed_batch, tiny_model_dir):
    """One PPO epoch over one mini-batch: pi_old's log-probs are the training forward's own, detached, so the separate
    scoring pass is skipped; with it stored instead, the loss and every gradient agree to 1e-5 (float rounding of
    other padding), and the ratio is exactly 1 at the first step either way."""
    trainer = trainer_for(tiny_model_dir, method="seed")
    skills = skills_for(fixed_batch)
    batch = trainer.build_batch(fixed_batch, skills)
    assert batch.old_logp is None  # on-policy: no pi_old pass
    assert trainer_for(tiny_model_dir, method="seed", ppo_epochs=2).build_batch(fixed_batch, skills).old_logp
    with torch.no_grad():
        old = trainer.policy.score_batch([s.prompt_ids for s in batch.steps], [s.response_ids for s in batch.steps])
    stored = dataclasses.replace(batch, old_logp=[lp.detach() for lp in old])
    ids = list(range(len(batch.steps)))
    grads, losses_ = [], []
    for b in (batch, stored):
        trainer.model.train()
        trainer.opt.zero_grad(set_to_none=True)
        loss, stats, _, _ = trainer.micro_loss(b, ids)
        loss.backward()
        losses_.append(loss.item())
        assert stats["train/clip_frac"] == 0.0 and abs(stats["train/approx_kl"]) < 1e-6
        grads.append([p.grad.clone() for p in trainer.trainable])
    assert losses_[0] == pytest.approx(losses_[1], abs=1e-5)
    assert all(torch.allclose(a, b, rtol=0, atol=1e-5) for a, b in zip(*grads))
    assert any(a.abs().sum() > 0 for a in grads[0])


def test_one_update_changes_weights_and_lowers_the_loss(fixed_batch, tiny_model_dir):
    trainer = trainer_for(tiny_model_dir, method="grpo", kl_coef=0.0)
    batch = trainer.build_batch(fixed_batch, [None] * 4)
    assert batch.advantage.abs().sum() > 0
    ids = list(range(len(batch.steps)))
    with torch.no_grad():  # pi_old stored, so the loss after the update is measured against the same ratio base
        old = trainer.policy.score_batch([s.prompt_ids for s in batch.steps], [s.response_ids for s in batch.steps])
        batch = dataclasses.replace(batch, old_logp=[lp.detach() for lp in old])
        before = trainer.micro_loss(batch, ids)[0].item()
    w0 = weights(trainer)
    trainer.learn(fixed_batch, 0)
    with torch.no_grad():
        after = trainer.micro_loss(batch, ids)[0].item()
    assert any(not torch.equal(w0[k], v) for k, v in weights(trainer).items())
    assert after < before


def test_gradient_checkpointing_by_need_leaves_the_update_unchanged(fixed_batch, tiny_model_dir, monkeypatch):
    """Always, never, or by need (auto: only a micro-batch above the token threshold recomputes): the same weights."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    from seed_core.method import update

    trainer = trainer_for(tiny_model_dir, method="seed", gradient_checkpointing="auto")
    batch = trainer.build_batch(fixed_batch, skills_for(fixed_batch))
    lengths = [s.length for s in batch.steps]
    short, long = lengths.index(min(lengths)), lengths.index(max(lengths))
    assert lengths[short] < lengths[long]
    monkeypatch.setattr(update, "CHECKPOINT_ABOVE_TOKENS", (lengths[short] + lengths[long]) // 2)
    layers = [m for m in trainer.model.modules() if isinstance(m, GradientCheckpointingLayer)]
    trainer.model.train()
    trainer.micro_loss(batch, [long])
    assert layers and all(m.gradient_checkpointing for m in layers)
    trainer.micro_loss(batch, [short])
    assert not any(m.gradient_checkpointing for m in layers)
    after = {}
    for ckpt in (False, True, "auto"):
        trainer = trainer_for(tiny_model_dir, method="seed", gradient_checkpointing=ckpt)
        assert trainer.model.is_gradient_checkpointing == (ckpt is not False)
        trainer.learn(fixed_batch, 0, skills=skills_for(fixed_batch, ok=(True, False, True, True)))
        after[ckpt] = weights(trainer)
    for ckpt in (True, "auto"):
        assert all(torch.allclose(after[False][k], after[ckpt][k], rtol=0, atol=1e-6) for k in after[False])
    assert any(not torch.equal(after[True][k], v) for k, v in weights(trainer_for(tiny_model_dir)).items())


@pytest.mark.fault("numeric")
def test_nonfinite_updates_are_skipped_then_stop(fixed_batch, tiny_model_dir):
    trainer = trainer_for(tiny_model_dir, method="grpo", max_nonfinite_in_row=2)
    batch = trainer.build_batch(fixed_batch, [None] * 4)
    batch = dataclasses.replace(batch, advantage=batch.advantage * float("nan"))
    w0 = weights(trainer)
    m, _ = trainer.optimize(batch, 0)
    assert m["train/skipped_steps"] == 1.0
    assert all(torch.equal(w0[k], v) for k, v in weights(trainer).items())
    with pytest.raises(NonFiniteError, match="2 optimizer steps in a row"):
        trainer.optimize(batch, 1)


def test_resume_gives_identical_weights_and_refuses_other_params(alfworld_root, tiny_model_dir, tmp_path):
    games = stratified_subset(list_games(alfworld_root, "valid_seen"), 2, seed=0)
    mdir = tmp_path / "manifests"
    for name in ("train", "valid_seen"):
        write_manifest(mdir / f"{name}.json", alfworld_root, games)
    p = params(method="sdar", sdar_skills="recipes/sdar_skills_alfworld.yaml")

    whole = RLRun(p, tiny_model_dir, mdir, tmp_path / "a")
    for e in whole.pending():
        whole.run_epoch(e)
    whole.pool.close()

    first = RLRun(p, tiny_model_dir, mdir, tmp_path / "b")
    first.run_epoch(1)
    first.pool.close()  # "killed" after epoch 1: a new process resumes
    after_one = weights(first.trainer)
    resumed = RLRun(p, tiny_model_dir, mdir, tmp_path / "b")
    assert resumed.pending() == [2]
    resumed.run_epoch(2)
    resumed.pool.close()
    a, b = weights(whole.trainer), weights(resumed.trainer)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (tmp_path / "b" / "epoch_002" / "skills.jsonl").read_text() == (
        tmp_path / "a" / "epoch_002" / "skills.jsonl"
    ).read_text()

    # rl.epochs 1 on the same folder (its fingerprint leaves epochs out) is the 1-epoch run, not the 2-epoch one
    shorter = RLRun(
        params(method="sdar", sdar_skills="recipes/sdar_skills_alfworld.yaml", epochs=1),
        tiny_model_dir,
        mdir,
        tmp_path / "b",
    )
    assert shorter.pending() == []
    assert all(torch.equal(after_one[k], v) for k, v in weights(shorter.trainer).items())
    summary = shorter.finish(tmp_path / "final", tmp_path / "rl.json", tmp_path / "updates.json")
    assert summary["updates"] == 1 and [v["epoch"] for v in summary["validation"]] == [1]

    with pytest.raises(ValueError, match=r"different parameters \(params.rl.method: 'sdar' -> 'grpo'\)"):
        RLRun(
            params(method="grpo", sdar_skills="recipes/sdar_skills_alfworld.yaml"), tiny_model_dir, mdir, tmp_path / "b"
        )
