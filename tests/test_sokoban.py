"""Sokoban behind the environment protocol: manifests of seeds, the rollout's rewards, expert steps, the oracle
on played trajectories, and one RL update per method with SmolLM2."""

import json

import pytest
import torch

from helpers import ONE_UPDATE
from seed_core.config import ConfigError, params_from_dict
from seed_core.envs import environment
from seed_core.envs.sokoban.env import EVAL_SEEDS, TRAIN_SEEDS
from seed_core.envs.sokoban.room import generate_room, room_from_text, solve
from seed_core.policy import Generation
from seed_core.records import DataError
from seed_core.rollout import play, summarize
from seed_core.stages.rl import RLRun, fingerprint

MANIFESTS = ("train", "warmup", "valid_seen", "valid_unseen")
SOKOBAN = {
    "env": {"name": "sokoban", "max_steps": 15, "history_length": 2, "workers": 0},
    "prepare": {"train_games": 6, "warmup_games": 4, "valid_seen_games": 3, "valid_unseen_games": 2},
}


def sokoban_params(**sections):
    raw = json.loads(json.dumps(SOKOBAN))
    for k, v in sections.items():
        raw.setdefault(k, {}).update(v)
    return params_from_dict(raw)


class Scripted:
    """A policy that answers each prompt from a table (prompt -> response); unknown prompts get `default`."""

    def __init__(self, answers: dict[str, str], default: str = "no idea"):
        self.answers, self.default, self.seen = answers, default, []

    def generate(self, prompts, **kw):
        self.seen += prompts
        return [Generation(self.answers.get(p, self.default), [1], [0.0], True) for p in prompts]


@pytest.fixture()
def manifests(tmp_path):
    p = sokoban_params()
    counts = environment(p).write_manifests(p.prepare, tmp_path)
    assert counts == {"train": 6, "warmup": 4, "valid_seen": 3, "valid_unseen": 2}
    return p, tmp_path


def test_manifests_are_seeds_from_disjoint_ranges(manifests):
    p, d = manifests
    env = environment(p)
    games = {n: env.read_manifest(d / f"{n}.json") for n in ("train", "warmup", "valid_seen", "valid_unseen")}
    seeds = {n: [int(e.game_id) for e in g] for n, g in games.items()}
    assert all(s == sorted(s) for s in seeds.values())
    assert all(s in TRAIN_SEEDS for s in seeds["train"] + seeds["warmup"])
    assert all(s in EVAL_SEEDS for s in seeds["valid_seen"] + seeds["valid_unseen"])
    assert not set(seeds["train"]) & set(seeds["warmup"]) and not set(seeds["valid_seen"]) & set(seeds["valid_unseen"])
    again = d / "again"
    env.write_manifests(p.prepare, again)
    assert all((again / f"{n}.json").read_text() == (d / f"{n}.json").read_text() for n in games)
    assert games["train"][0].sha256 == generate_room(seeds["train"][0]).sha256()


def test_more_warmup_rooms_leave_the_rl_and_held_out_rooms_as_they_were(tmp_path):
    def rooms(warmup: int, valid: int) -> dict[str, list[str]]:
        p = sokoban_params(prepare={"warmup_games": warmup, "valid_seen_games": valid})
        out = tmp_path / f"w{warmup}-v{valid}"
        environment(p).write_manifests(p.prepare, out)
        return {n: [g["game_id"] for g in json.loads((out / f"{n}.json").read_text())["games"]] for n in MANIFESTS}

    small, large, more_valid = rooms(4, 3), rooms(40, 3), rooms(4, 9)
    assert small["train"] == large["train"] and set(small["warmup"]) < set(large["warmup"])
    for name in ("valid_seen", "valid_unseen"):
        assert small[name] == large[name]
    assert small["train"] == more_valid["train"] and small["warmup"] == more_valid["warmup"]
    assert set(small["valid_seen"]) < set(more_valid["valid_seen"] + more_valid["valid_unseen"])


def test_bad_manifests_and_params_are_refused(manifests):
    p, d = manifests
    env = environment(p)
    m = json.loads((d / "train.json").read_text())
    m["games"][0]["game_id"] = str(EVAL_SEEDS.start + 5)  # an evaluation seed in a training manifest
    (d / "leak.json").write_text(json.dumps(m))
    with pytest.raises(DataError, match=r"seed 1000005 of split 'train' is outside its range \[0, 1000000\)"):
        env.read_manifest(d / "leak.json")
    other = environment(sokoban_params(env={"sokoban": {"dim": [7, 7]}}))
    with pytest.raises(DataError, match=r"no longer matches its recorded sha256.*sokoban.dim=\[7, 7\]"):
        other.read_manifest(d / "train.json")
    m["games"][0]["game_id"] = "valid_seen/x"
    (d / "bad.json").write_text(json.dumps(m))
    with pytest.raises(DataError, match="'valid_seen/x' is not a seed"):
        env.read_manifest(d / "bad.json")
    with pytest.raises(ConfigError, match=r"`env.name` must be one of \['alfworld', 'sokoban'\], got 'chess'"):
        sokoban_params(env={"name": "chess"})
    with pytest.raises(ConfigError, match="env.sokoban.boxes"):
        sokoban_params(env={"sokoban": {"boxes": 50}})
    with pytest.raises(ConfigError, match="env.sokoban.dim"):
        sokoban_params(env={"sokoban": {"dim": [3, 3]}})


def test_expert_steps_replay_through_the_rollout_with_the_rules_rewards(manifests):
    """The expert's examples are exactly the rollout's prompts: answered from them, every room is won with the
    solver's plan, and each step's reward is -0.1 (+1 when the box lands on the target, +10 for the win)."""
    p, d = manifests
    env = environment(p)
    entries = env.read_manifest(d / "warmup.json")
    examples = env.expert_examples(entries, p.env, progress=False)
    policy = Scripted({x["prompt"]: x["completion"] for x in examples})
    with env.open_pool(0) as pool:
        trajs = play(policy, pool, entries, group_size=1, env=p.env, gen=p.rollout, seed=0, tag="t", progress=False)
    for e, t in zip(entries, trajs):
        plan = solve(generate_room(int(e.game_id)))
        assert t.won and [s.action for s in t.steps] == plan and t.invalid_count == 0
        assert [s.reward for s in t.steps] == pytest.approx([-0.1] * (len(plan) - 1) + [-0.1 + 1 + 10])
    assert summarize(trajs)["success/sokoban"] == 1.0


def test_invalid_and_unknown_actions_are_no_ops_with_the_penalty(manifests):
    p, d = manifests
    env = environment(p)
    entry = env.read_manifest(d / "valid_seen.json")[:1]
    for answer in ("<think>x</think><action>jump</action>", "<action>up</action>", "up"):
        with env.open_pool(0) as pool:
            (t,) = play(Scripted({}, answer), pool, entry, group_size=1, env=p.env, gen=p.rollout, seed=0, tag="t")
        assert not t.won and t.length == 15 and t.invalid_count == 15
        assert [s.reward for s in t.steps] == pytest.approx([-0.1 - 0.1] * 15)
        assert {s.feedback for s in t.steps} == {generate_room(int(entry[0].game_id)).text()}  # nothing moved


def test_oracle_and_key_names_on_played_trajectories(manifests):
    p, d = manifests
    env = environment(p)
    entry = env.read_manifest(d / "valid_seen.json")[:1]
    with env.open_pool(0) as pool:
        (lost,) = play(Scripted({}, "nothing"), pool, entry, group_size=1, env=p.env, gen=p.rollout, seed=0, tag="t")
    answer = json.loads(env.oracle(300).complete_trajectories([lost])[0].text)
    room = generate_room(int(entry[0].game_id))
    assert answer["episode_summary"].startswith(f"Failure after 15 step(s) (optimal {len(solve(room))})")
    assert "invalid" in answer["episode_skill"] and len(answer["episode_skill"]) <= 300
    assert env.key_names(lost) == [f"({r}, {c})" for r, c in room.targets]


@pytest.mark.parametrize(
    "method,advantage",
    [
        ("grpo", "grpo"),
        ("seed", "grpo"),
        ("grpo_opsd", "grpo"),
        ("sdar", "grpo"),
        ("seed", "gigpo"),
        ("seed_shuffled", "grpo"),
        ("seed_oracle", "grpo"),
    ],
)
def test_one_rl_update_per_method_on_sokoban(method, advantage, tiny_model_dir, tmp_path):
    """A tiny random-init model plays 2 rooms x 2 episodes of 3 steps and the update runs (the real model's update
    on these rooms is the pipeline's). It answers invalidly, so every episode has the same return and the outcome
    advantage is zero; SDAR's fixed skill still moves the weights through OPD."""
    p = sokoban_params(
        env={"max_steps": 3},
        model={"dtype": "float32"},
        rollout={"max_new_tokens": 12, "batch_size": 8, "backend": "hf"},
        rl={"method": method, "advantage": advantage, **ONE_UPDATE, "sdar_skills": "recipes/sdar_skills_sokoban.yaml"},
    )
    environment(p).write_manifests(p.prepare, tmp_path / "m")
    run = RLRun(p, tiny_model_dir, tmp_path / "m", tmp_path / "run")
    before = {k: v.detach().clone() for k, v in run.trainer.model.named_parameters() if v.requires_grad}
    out = run.run_epoch(1)
    run.pool.close()
    after = dict(run.trainer.model.named_parameters())
    changed = any(not torch.equal(before[k], after[k]) for k in before)
    assert "loss/pg" in out and "val/success_rate" in out and out["rollout/episode_length"] == 3
    skills = [json.loads(x) for x in (tmp_path / "run" / "epoch_001" / "skills.jsonl").read_text().splitlines()]
    assert len(skills) == (0 if method == "grpo" else 4)
    # the solver judges every step: invalid answers in a solvable room are wasted, so no AUC has a pair to rank
    assert out["credit/optimal_frac"] == 0.0 and not any(k.startswith("credit/auc") for k in out)
    for x in skills:
        assert [s["label"] for s in x["rescore"]["steps"]] == ["wasted"] * 3
        # a step re-scored with a skill keeps its Δ (SDAR's and the oracle's skills parse; the tiny model's never do)
        assert ("delta_action_mean" in x["rescore"]["steps"][0]) == (method in ("sdar", "seed_oracle"))
    if method == "seed_shuffled":  # each record names the trajectory of the other room its skill was written for
        game_of = {x["traj_id"]: x["game_id"] for x in skills}
        donors = [x["producer"].removeprefix("shuffled:") for x in skills]
        assert sorted(donors) == sorted(game_of) and len(set(game_of.values())) == 2
        assert all(game_of[d] != x["game_id"] for d, x in zip(donors, skills))
    if method == "seed_oracle":  # the oracle (solver claims) describes each episode: 3 invalid answers
        assert all(x["producer"].startswith("oracle") and "invalid" in x["skill"] for x in skills)
        assert out["opd/active_token_ratio"] > 0 and out["skills/consistent"] == 1.0 and changed
    if method == "sdar":
        assert all("never push a box into a corner" in x["skill"].lower() for x in skills)
        assert out["opd/active_token_ratio"] > 0 and changed
    if method == "grpo":
        assert out["rollout/invalid_rate"] == 1.0 and not changed


def test_a_run_fingerprint_survives_its_json_round_trip(tmp_path):
    """run.json stores the fingerprint as JSON: a tuple param (env.sokoban.dim) must compare equal on resume."""
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    fp = fingerprint(sokoban_params(), tmp_path)
    assert json.loads(json.dumps(fp)) == fp and fp["params"]["env"]["sokoban"]["dim"] == [6, 6]


class SolverPolicy:
    """Answers Sokoban step prompts with the solver's move where `follow(prompt, call)` says so, else `up`; any other
    prompt (the analyzer's) gets a non-answer. Token ids come from the real tokenizer, so the answers re-score."""

    def __init__(self, tok, follow):
        self.tok, self.follow, self.calls = tok, follow, 0

    def generate(self, prompts, **kw):
        out = []
        for p in prompts:
            self.calls += 1
            head, sep, rest = p.partition("Your current observation is:\n")
            if not sep:
                text = "no skill"
            else:
                plan = solve(room_from_text(rest.split("\nYour admissible actions")[0]))
                move = plan[0] if plan and self.follow(p, self.calls) else "up"
                text = f"<think>I move.</think>\n<action>{move}</action>"
            ids = self.tok.encode(text, add_special_tokens=False)
            out.append(Generation(text, ids, [-1.0] * len(ids), True))
        return out


def probe_setup(tiny_model_dir, tmp_path):
    from seed_core.method.update import Trainer
    from seed_core.models import load_for

    p = sokoban_params(
        model={"dtype": "float32"},
        rollout={"max_new_tokens": 12, "batch_size": 8, "backend": "hf"},
        rl={"method": "seed", "analyzer_max_new_tokens": 8},
        teacher={"oracle_max_chars": 300},
    )
    env = environment(p)
    env.write_manifests(p.prepare, tmp_path)
    model, tok = load_for(tiny_model_dir, p.model)
    return Trainer(model, tok, p, sampler_dir=tiny_model_dir, env=env), env, env.read_manifest(tmp_path / "train.json")


def test_credit_probe_on_episodes_the_solver_labels(tiny_model_dir, tmp_path):
    """Episodes that follow the solver two moves in three: the probe labels every step, GRPO's advantage is 0.5
    within trajectories exactly, the oracle's skills cover every step and are consistent, and the tiny model's own
    (unparseable) skills cover none."""
    from seed_core.tools.probe import probe_credit

    trainer, env, games = probe_setup(tiny_model_dir, tmp_path)
    trainer.sampler = SolverPolicy(trainer.policy.tok, lambda _p, call: call % 3 != 0)
    with env.open_pool(0) as pool:
        c = probe_credit(trainer, env, pool, games[:4], group_size=2, seed=0, n_boot=50)
    assert c["episodes"] == 8 and sum(c["labels"].values()) == c["steps"] > 0
    assert c["labels"]["optimal"] > 0 and c["labels"]["wasted"] > 0
    table = c["table"]
    assert table["grpo/advantage"]["within"] == 0.5 and table["grpo/advantage"]["within_pairs"] > 0
    assert table["oracle/delta"]["steps"] == c["steps"] and table["self/delta"]["steps"] == 0
    assert table["shuffled_oracle/gate"]["steps"] == c["steps"] and table["shuffled/gate"]["steps"] == 0
    every = ("parse_rate", "skills/consistent", "skills/outcome_true", "skills/facts_true")  # the oracle states counts
    assert c["skills"]["oracle"] == dict.fromkeys(every, 1.0) | {
        k: v for k, v in c["skills"]["oracle"].items() if k == "skills/move_lists_true"
    }
    assert c["skills"]["self"]["parse_rate"] == 0.0
    row = table["oracle/delta_action"]
    assert row["pooled_lo"] <= row["pooled"] <= row["pooled_hi"]

    # the per-episode file keeps what a later re-analysis needs: labels, skill texts, every signal per step
    from seed_core.tools.probe import credit_rows

    rows = credit_rows(c)
    assert len(rows) == 8 and all(len(r["signals"]["oracle/gate"]) == len(r["steps"]) for r in rows)
    assert all(r["skills"]["self"] is None and r["skills"]["oracle"] for r in rows)
    assert all(v is None for r in rows for v in r["signals"]["self/delta"])  # no parsed own skill: no signal
    gates = [v for r in rows for v in r["signals"]["oracle/gate"]]
    assert len(gates) == c["steps"] and all(0 < v < 1 for v in gates)
    assert [r["step_labels"] for r in rows] == c["step_labels"]


def test_uplift_probe_puts_the_solvers_plan_in_the_prompt(tiny_model_dir, tmp_path):
    """A policy that follows a plan only when the prompt's skill block holds one: the plain prompt and every
    episode-level skill leave it at its plain success; the per-step plan hint wins every room."""
    from seed_core.envs.sokoban.prompts import SOKOBAN_PLAN_HINT as PLAN_HINT
    from seed_core.tools.probe import probe_uplift

    trainer, env, games = probe_setup(tiny_model_dir, tmp_path)
    hint = PLAN_HINT.split("{")[0]
    trainer.sampler = SolverPolicy(trainer.policy.tok, lambda p, _call: hint in p)
    with env.open_pool(0) as pool:
        u = probe_uplift(trainer, env, pool, games[:4], seed=0, n_boot=50)
    rows = u["conditions"]
    assert list(rows) == ["plain", "oracle", "self", "plan", "shuffled"]
    assert rows["plan"]["success"] == 1.0 and rows["plan"]["uplift"] == 1.0 - rows["plain"]["success"]
    for cond in ("oracle", "self", "shuffled"):
        assert rows[cond]["success"] == rows["plain"]["success"] and rows[cond]["uplift"] == 0.0
    assert rows["plain"]["success_lo"] <= rows["plain"]["success"] <= rows["plain"]["success_hi"]


def test_legibility_probe_scores_greedy_moves_against_chance(tiny_model_dir, tmp_path):
    """A policy that always plays the solver's move is optimal on every state, one that always answers `up` only
    where `up` is optimal; chance is the share of optimal moves among the four, computed here by hand."""
    from seed_core.tools.probe import MOVE_STATES, probe_moves

    trainer, env, games = probe_setup(tiny_model_dir, tmp_path)
    trainer.sampler = SolverPolicy(trainer.policy.tok, lambda _p, _call: True)
    m = probe_moves(trainer, env, games[:4], seed=0, n_boot=50)
    assert m["rooms"] == 4 and m["states"] == 4 * (1 + MOVE_STATES)
    assert m["optimal"] == 1.0 and m["invalid"] == 0.0 and m["above_chance"] == 1.0 - m["chance"]
    states = [x for x in env.expert_examples(games[:4], trainer.params.env, progress=False) if x["step"] == 0]
    states += env.off_path_examples(games[:4], trainer.params.env, MOVE_STATES, 0, progress=False)
    rooms = [room_from_text(x["observation"]) for x in states]
    shortest = [len(solve(r)) for r in rooms]
    good = [
        [(p := solve(r.moved(a))) is not None and len(p) == n - 1 for a in ("up", "down", "left", "right")]
        for r, n in zip(rooms, shortest)
    ]
    assert m["chance"] == pytest.approx(sum(sum(g) / 4 for g in good) / len(good))
    trainer.sampler = SolverPolicy(trainer.policy.tok, lambda _p, _call: False)
    up = probe_moves(trainer, env, games[:4], seed=0, n_boot=50)
    assert up["optimal"] == pytest.approx(sum(g[0] for g in good) / len(good)) and up["chance"] == m["chance"]
    assert up["optimal_lo"] <= up["optimal"] <= up["optimal_hi"]


def test_seed_probe_command_chance_baseline_and_errors(manifests, tmp_path, capsys):
    from seed_core.tools.cli import main

    p, mdir = manifests
    (tmp_path / "params.yaml").write_text(json.dumps(SOKOBAN))
    out = tmp_path / "probe.json"
    panels = [str(mdir / "valid_seen.json"), str(mdir / "valid_unseen.json")]
    args = ["probe", "--params", str(tmp_path / "params.yaml"), "--manifest", *panels, "--parts", "random"]
    main([*args, "--bootstrap", "100", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["random"]["rooms"] == 5 and result["random"]["runs"] == 200 and "credit" not in result
    assert f"random moves: 5 rooms x 200 episodes, success {result['random']['success']:.3f}" in capsys.readouterr().out
    (tmp_path / "alf.yaml").write_text("env: {name: alfworld}\n")
    with pytest.raises(SystemExit) as e:
        main(["probe", "--params", str(tmp_path / "alf.yaml"), "--parts", "random"])
    assert e.value.code == 2 and "needs an environment whose solver labels every step" in capsys.readouterr().err
