from pathlib import Path

import pytest
import yaml

from seed_core.config import METHODS, ConfigError, explain_markdown, field_docs, load_params, params_from_dict


def test_default_params_file_loads():
    p = load_params("params.yaml")
    assert p.model.name_or_path == "smollm2-135m-instruct"
    assert p.env.history_length == yaml.safe_load(open("params.yaml"))["env"]["history_length"]


@pytest.mark.fault("params")
@pytest.mark.parametrize(
    "raw, message",
    [
        ({"envv": {}}, "unknown key `envv`"),
        (
            {"env": {"max_step": 3}},
            "unknown key `env.max_step`; allowed keys here: ['alfworld', 'history_length', 'invalid_penalty', 'max_steps', 'name', 'observation', 'sokoban', 'win_reward', 'workers']",
        ),
        ({"env": {"max_steps": "ten"}}, "`env.max_steps` must be an integer, got 'ten'"),
        ({"env": {"max_steps": 0}}, "`env.max_steps` must be >= 1"),
        (
            {"model": {"dtype": "fp8"}},
            "`model.dtype` must be one of ['auto', 'float32', 'bfloat16', 'float16'], got 'fp8'",
        ),
        ({"prepare": {"valid_seen_games": 500}}, "`prepare.valid_seen_games` must be -1 (whole split) or 1..140"),
        ({"evaluate": {"modes": ["greedy", "beam"]}}, "`evaluate.modes[1]` must be one of ['greedy', 'sampled']"),
        ({"rollout": {"top_p": 1.5}}, "`rollout.top_p` must be in (0, 1]"),
        ({"warmup": {"enabled": "yes"}}, "`warmup.enabled` must be a bool"),
    ],
)
def test_bad_params_are_refused_naming_the_key(raw, message):
    with pytest.raises(ConfigError) as e:
        params_from_dict(raw)
    assert message in str(e.value)


@pytest.mark.fault("params")
def test_missing_params_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_params(tmp_path / "nope.yaml")


@pytest.mark.fault("params")
@pytest.mark.parametrize(
    "raw, message",
    [
        ({"rollout": {"top_p": 2}}, "params: `rollout.top_p` must be in (0, 1], got 2"),
        ({"evaluate": {"generation": {"top_p": 2}}}, "params: `evaluate.generation.top_p` must be in (0, 1], got 2"),
        ({"rollout": {"batch_size": 0}}, "params: `rollout.batch_size` must be >= 1, got 0"),
        ({"evaluate": {"generation": {"temperature": -1}}}, "params: `evaluate.generation.temperature` must be >= 0"),
    ],
)
def test_shared_section_errors_name_the_full_key(raw, message):
    with pytest.raises(ConfigError) as e:
        params_from_dict(raw)
    assert str(e.value).startswith(message)


def test_every_parameter_is_documented():
    rows = field_docs()
    keys = [key for key, _, _, _ in rows]
    assert len(keys) == len(set(keys))
    assert "evaluate.generation.top_p" in keys and "rl.clip_eps" in keys
    undocumented = [key for key, _, _, doc in rows if not doc.strip()]
    assert not undocumented, f"add a docstring under these fields in seed_core/config.py: {undocumented}"


def test_field_docs_follow_declaration_order_and_defaults():
    rows = {key: (tp, default) for key, tp, default, _ in field_docs()}
    assert list(rows)[:2] == ["data.alfworld_data", "model.name_or_path"]
    assert rows["evaluate.generation.temperature"] == ("float", "0.4")  # the nested section's own default
    assert rows["evaluate.generation"] == ("section", "")  # listed once, before its leaves
    assert rows["rollout.temperature"] == ("float", "1.0")
    assert rows["rl.dual_clip_c"] == ("float | null", "3.0")
    assert rows["rl.method"][0] == " | ".join(repr(m) for m in METHODS)


def test_readme_parameter_table_is_current():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    start, end = "<!-- params-table:start -->\n", "<!-- params-table:end -->"
    assert start in readme and end in readme, "README.md lacks the params-table markers"
    table = readme.split(start, 1)[1].split(end, 1)[0]
    assert table == explain_markdown(), (
        "README.md's parameter table is stale; regenerate it with `seed params --explain` "
        "(between the params-table markers)"
    )


def test_seed_params_explain_prints_the_table(capsys):
    from seed_core.tools.cli import build_parser

    args = build_parser().parse_args(["params", "--explain"])
    args.func(args)
    assert capsys.readouterr().out == explain_markdown()


RECIPES = Path(__file__).resolve().parents[2] / "recipes"


@pytest.mark.parametrize(
    "path", [p for p in sorted(RECIPES.glob("*.yaml")) if not p.name.startswith("sdar_skills")], ids=lambda p: p.name
)
def test_every_params_recipe_loads(path):
    assert load_params(path).rl.epochs >= 1


def test_the_sokoban_sweep_fits_the_sokoban_recipe():
    from seed_core.tools.sweep import check_params, load_recipe

    combos = load_recipe(RECIPES / "sweeps/sokoban-science.yaml")
    assert {(c.method, c.seed) for c in combos} == {(m, s) for m in ("grpo", "seed") for s in range(3)}
    for c in combos:
        raw = check_params(RECIPES / "sokoban.yaml", c.overrides)
        assert raw["env"]["name"] == "sokoban" and raw["rl"]["method"] == c.method
