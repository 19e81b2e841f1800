"""The vision track: image observations, the SmolVLM composite, images through sampling, re-scoring, the update and
SFT, the tiny Qwen2.5-VL path, and the errors for what does not fit."""

import dataclasses
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from helpers import tiny_qwen_vl
from seed_core.config import ConfigError, SFTSettings, VisionConfig, params_from_dict
from seed_core.envs import GameEntry, observation_image
from seed_core.envs.sokoban.env import Sokoban, SokobanPool
from seed_core.envs.sokoban.prompts import PERCEPTION_PROMPT
from seed_core.envs.sokoban.room import generate_room, grid_rgb
from seed_core.method.rescore import score_steps, step_tokens
from seed_core.method.update import Trainer
from seed_core.models import build_composite, lora_config, vision_modules
from seed_core.models import load_model as load
from seed_core.policy import open_sampler
from seed_core.policy.hf import HFPolicy
from seed_core.policy.vision import IMAGE_MARK, VisionError
from seed_core.records import Skill
from seed_core.rollout import play
from seed_core.sft import train_sft
from seed_core.stages.warmup import cell_accuracy

TINY_VISION = VisionConfig(hidden_size=32, layers=1, heads=1)
VISUAL = {
    "env": {"name": "sokoban", "observation": "image", "max_steps": 2, "workers": 0, "history_length": 1},
    "rollout": {"max_new_tokens": 5, "batch_size": 8, "backend": "hf"},
    "rl": {"games_per_update": 2, "group_size": 2, "learning_rate": 0.01, "mini_batch_steps": 64},
}
ROOMS = [GameEntry(str(s), "train", "sokoban", "") for s in (4, 7)]


def visual_params(**rl):
    raw = json.loads(json.dumps(VISUAL))
    raw["rl"].update(rl)
    return params_from_dict(raw)


@pytest.fixture(scope="module")
def composite_dir(tiny_model_dir, tmp_path_factory):
    return build_composite(tiny_model_dir, tmp_path_factory.mktemp("composite") / "m", TINY_VISION)


@pytest.fixture(scope="module")
def qwen_dir(base_model_dir, tmp_path_factory):
    return tiny_qwen_vl(base_model_dir, tmp_path_factory.mktemp("qwen-vl"))


def played(model_dir, p=None):
    p = p or visual_params()
    model, tok = load(model_dir)
    trainer = Trainer(model, tok, p)
    with SokobanPool((6, 6), 1) as pool:
        trajs = play(
            trainer.policy, pool, ROOMS, group_size=2, env=p.env, gen=p.rollout, seed=0, tag="t", progress=False
        )
    trajs[0] = dataclasses.replace(trajs[0], won=True, episode_return=10.0)  # advantages differ within a group
    return trainer, trajs


def skills(trajs):
    return [
        Skill(t.traj_id, t.game_id, "sokoban", "failure", "s", "push the box left", "ok", "", "test", "h")
        for t in trajs
    ]


def trained(model_dir, method, **rl):
    model, tok = load(model_dir)
    return Trainer(model, tok, visual_params(method=method, **rl))


def weights(trainer):
    return {k: v.detach().clone() for k, v in trainer.model.named_parameters() if v.requires_grad}


# ---------------------------------------------------------------- observations


def test_a_stored_observation_redraws_the_image_it_was():
    room = generate_room(11)
    assert np.array_equal(grid_rgb(room.text()), room.rgb())
    img = grid_rgb("# # #\n# P #\n# # #")
    assert img.shape == (48, 48, 3)
    assert (img[16:32, 16:32] != img[0:16, 0:16]).any()  # the player's tile is not a wall's
    assert np.array_equal(img[0:16, 0:16], img[32:48, 32:48])  # two wall tiles, identical pixels
    with pytest.raises(ValueError, match="not a Sokoban grid"):
        grid_rgb("# # #\n# Q #")


def test_image_prompts_show_the_mark_once_and_no_grid():
    env = visual_params().env
    examples = Sokoban().expert_examples(ROOMS[:1], dataclasses.replace(env, max_steps=15), progress=False)
    first, second = examples[0], examples[1]
    assert first["prompt"].count(IMAGE_MARK) == 1 and first["observation"] not in first["prompt"]
    assert "[Action 1: '" in second["prompt"] and "[Observation" not in second["prompt"]  # no image history
    both = dataclasses.replace(env, observation="both", max_steps=15)
    shown = Sokoban().expert_examples(ROOMS[:1], both, progress=False)[0]
    assert shown["prompt"].count(IMAGE_MARK) == 1 and shown["observation"] in shown["prompt"]
    perception = Sokoban().perception_examples(ROOMS[:1], both, progress=False)
    assert perception[0]["prompt"] == PERCEPTION_PROMPT and perception[0]["completion"] == generate_room(4).text()
    assert perception[-1]["completion"].count("√") == 1  # the last state is the solved room
    assert observation_image(env, first["observation"]).shape == (96, 96, 3)
    assert observation_image(dataclasses.replace(env, observation="text"), first["observation"]) is None


# ---------------------------------------------------------------- the composite


def test_the_composite_is_reproducible_from_its_seed_and_keeps_smollm2s_weights(base_model_dir, tmp_path):
    cfg = VisionConfig()
    a = load_file(build_composite(base_model_dir, tmp_path / "a", cfg) / "model.safetensors")
    b = load_file(build_composite(base_model_dir, tmp_path / "b", cfg) / "model.safetensors")
    c = load_file(
        build_composite(base_model_dir, tmp_path / "c", dataclasses.replace(cfg, seed=1)) / "model.safetensors"
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    vision = [k for k in a if "vision_model" in k or "connector" in k]
    assert vision and any(not torch.equal(a[k], c[k]) for k in vision)

    text = load_file(base_model_dir / "model.safetensors")
    for k, v in text.items():
        mine = a[k.replace("model.", "model.text_model.", 1)]
        assert torch.equal(mine[: v.shape[0]], v), k  # the embedding gains one <image> row at the end
    emb = a["model.text_model.embed_tokens.weight"]
    assert emb.shape[0] == text["model.embed_tokens.weight"].shape[0] + 1
    config = json.loads((tmp_path / "a/config.json").read_text())
    assert config["vision_config"]["image_size"] == 96 and config["scale_factor"] == 1


def test_lora_adapts_the_language_model_only(composite_dir):
    model, _ = load(composite_dir)
    assert vision_modules(model) == ["model.vision_model", "model.connector"]
    trainable = lora_config(model, 4, 8, train_vision=True)
    assert not any("vision_model" in t or "connector" in t for t in trainable.target_modules)
    assert trainable.modules_to_save == ["model.vision_model", "model.connector"]
    assert lora_config(model, 4, 8, train_vision=False).modules_to_save is None


# ---------------------------------------------------------------- sampling, re-scoring, the update


def test_sampled_and_rescored_image_prompts_are_the_same_tokens_and_pixels(composite_dir):
    trainer, trajs = played(composite_dir)
    policy = trainer.policy
    image_token = policy.model.config.image_token_id
    texts = ["push the box left", None, "walk around it", None]
    steps = step_tokens(policy.encoder, trajs, texts, env=trainer.params.env)
    assert len(steps) == sum(t.length for t in trajs)
    for s in steps:
        step = trajs[s.traj].steps[s.step]
        assert np.array_equal(s.image, grid_rgb(step.observation))
        assert s.prompt_ids == policy.encoder.encode_prompt(step.prompt, s.image)
        assert s.prompt_ids.count(image_token) == 36  # one token per tile
        if texts[s.traj] is not None:
            assert s.teacher_ids.count(image_token) == 36 and texts[s.traj] in policy.tok.decode(s.teacher_ids)
    # the sampler recorded the log-probs the trainer computes: same ids, same pixels
    for s, lp in zip(steps, score_steps(policy, steps, "prompt", 4096)):
        assert torch.allclose(lp, torch.tensor(s.sampler_logp), atol=1e-4)
    # and the pixels matter: another room's image changes them
    other = [dataclasses.replace(s, image=generate_room(99).rgb()) for s in steps]
    assert any(
        not torch.allclose(a, b)
        for a, b in zip(score_steps(policy, steps, "prompt", 4096), score_steps(policy, other, "prompt", 4096))
    )


def test_a_seed_update_with_images_changes_weights_and_lambda_zero_equals_grpo(composite_dir):
    _, trajs = played(composite_dir)
    grpo, seed0, seed = (
        trained(composite_dir, "grpo"),
        trained(composite_dir, "seed", opd_lambda=0.0),
        trained(composite_dir, "seed", opd_lambda=1.0),
    )
    before = weights(seed)
    grpo.learn(trajs, 0)
    m, _ = seed0.learn(trajs, 0, skills=skills(trajs))
    assert m["opd/active_token_ratio"] == 1.0  # the skill-conditioned scores were computed, with weight 0
    a, b = weights(grpo), weights(seed0)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    seed.learn(trajs, 0, skills=skills(trajs))
    after = weights(seed)
    assert any(not torch.equal(a[k], v) for k, v in after.items())
    moved = [k for k in after if not torch.equal(before[k], after[k])]
    assert any("vision_model" in k for k in moved) and any("lora" in k for k in moved)  # vision.trainable: true


def test_frozen_vision_stays_put_in_an_update(composite_dir):
    _, trajs = played(composite_dir)
    raw = json.loads(json.dumps(VISUAL)) | {"vision": {"trainable": False}}
    model, tok = load(composite_dir)
    trainer = Trainer(model, tok, params_from_dict(raw))
    assert not any("vision_model" in k or "connector" in k for k in weights(trainer))
    trainer.learn(trajs, 0)


def test_the_tiny_qwen2_5_vl_generates_scores_and_updates(qwen_dir):
    trainer, trajs = played(qwen_dir)
    steps = step_tokens(trainer.policy.encoder, trajs, [None] * len(trajs), env=trainer.params.env)
    pad = trainer.policy.model.config.image_token_id
    assert all(s.prompt_ids.count(pad) == 9 for s in steps)  # 96 px -> 84 px: 6x6 patches of 14, merged 2x2
    for s, lp in zip(steps, score_steps(trainer.policy, steps, "prompt", 4096)):
        assert torch.allclose(lp, torch.tensor(s.sampler_logp), atol=1e-4)
    before = weights(trainer)
    trainer.learn(trajs, 0, skills=skills(trajs))
    assert any(not torch.equal(before[k], v) for k, v in weights(trainer).items())


# ---------------------------------------------------------------- SFT and the perception warm-up


def test_image_sft_trains_the_vision_encoder_only_when_asked(composite_dir, tmp_path):
    env = visual_params().env
    examples = [
        {"prompt": x["prompt"], "completion": x["completion"], "image": observation_image(env, x["observation"])}
        for x in Sokoban().perception_examples(ROOMS[:1], dataclasses.replace(env, max_steps=15), progress=False)
    ][:3]
    start = load_file(composite_dir / "model.safetensors")
    settings = SFTSettings(epochs=1.0, learning_rate=1e-2, batch_size=2, lora_r=4, lora_alpha=8, max_seq_len=1024)
    for trainable in (True, False):
        out = tmp_path / str(trainable)
        m = train_sft(composite_dir, examples, None, out, settings, train_vision=trainable)
        assert m["data/examples"] == 3 and m["data/answer_tokens"] > 0 and np.isfinite(m["train/loss"])
        done = load_file(out / "model.safetensors")
        vision = [k for k in start if "vision_model" in k]
        assert any(not torch.equal(start[k], done[k]) for k in vision) == trainable
        assert any(not torch.equal(start[k], done[k]) for k in start if "text_model.layers" in k)


def test_cell_accuracy_counts_cells_by_hand():
    class Answers:  # a policy whose answers are given
        def generate(self, prompts, *, images, **kw):
            return [type("G", (), {"text": t}) for t in ("# _\nO X", "# _\nX")]

    examples = [{"prompt": "p", "image": None, "completion": "# _\nO P"}] * 2
    # 3 of 4 right (O right, P wrong); then 2 right, 1 wrong (O), 1 missing (P)
    assert cell_accuracy(Answers(), examples) == {"cells": (3 + 2) / 8, "objects": 1 / 4}


# ---------------------------------------------------------------- what does not fit


def test_what_does_not_fit_is_refused_naming_the_fix(composite_dir, tiny_model_dir):
    with pytest.raises(ConfigError, match="only Sokoban renders images"):
        params_from_dict({"env": {"observation": "image"}})
    with pytest.raises(ConfigError, match="vision.image_size.*image_size 128"):
        params_from_dict({"env": {"name": "sokoban", "sokoban": {"dim": [8, 8]}}, "vision": {"composite": True}})

    p = visual_params()
    with pytest.raises(VisionError, match="env.observation.*text-only model.*vision.composite: true"):
        with open_sampler(tiny_model_dir, p, p.rollout, 0):
            pass
    model, tok = load(tiny_model_dir)
    with pytest.raises(VisionError, match="text-only model"):
        Trainer(model, tok, p)

    policy = HFPolicy(*load(composite_dir))
    prompt = f"look: {IMAGE_MARK}"
    with pytest.raises(VisionError, match=r"image is 64x64 px.*takes 96x96.*vision.image_size"):
        policy.encoder.encode_prompt(prompt, np.zeros((64, 64, 3), np.uint8))
    with pytest.raises(VisionError, match=r"must be RGB.*\(96, 96\) uint8"):
        policy.encoder.encode_prompt(prompt, np.zeros((96, 96), np.uint8))
    with pytest.raises(VisionError, match="exactly once.*0 times"):
        policy.encoder.encode_prompt("no mark here", np.zeros((96, 96, 3), np.uint8))
    policy.encoder.max_prompt_tokens = 20
    with pytest.raises(VisionError, match="over max_prompt_tokens=20.*cut the image"):
        policy.encoder.encode_prompt(prompt, np.zeros((96, 96, 3), np.uint8))


def test_a_vision_model_samples_on_the_hf_backend(composite_dir):
    p = visual_params()
    p = dataclasses.replace(p, rollout=dataclasses.replace(p.rollout, backend="vllm"))
    with pytest.warns(UserWarning, match="the vLLM backend takes no images"):
        with open_sampler(composite_dir, p, p.rollout, 0) as sampler:
            assert isinstance(sampler, HFPolicy) and sampler.encoder.vision is not None
