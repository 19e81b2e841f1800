import pytest

from seed_core.config import ConfigError, load_params, params_from_dict


def test_default_params_file_loads():
    p = load_params("params.yaml")
    assert p.model.name_or_path == "smollm2-135m-instruct"
    assert p.env.history_length >= 0


@pytest.mark.fault("params")
@pytest.mark.parametrize(
    "raw, message",
    [
        ({"envv": {}}, "unknown key `envv`"),
        ({"env": {"max_step": 3}}, "unknown key `env.max_step`; allowed keys here: ['history_length', 'invalid_penalty', 'max_steps', 'win_reward', 'workers']"),
        ({"env": {"max_steps": "ten"}}, "`env.max_steps` must be an integer, got 'ten'"),
        ({"env": {"max_steps": 0}}, "`env.max_steps` must be >= 1"),
        ({"model": {"dtype": "fp8"}}, "`model.dtype` must be one of ['auto', 'float32', 'bfloat16', 'float16'], got 'fp8'"),
        ({"prepare": {"valid_seen_games": 500}}, "`prepare.valid_seen_games` must be -1 (whole split) or 1..140"),
        ({"evaluate": {"modes": ["greedy", "beam"]}}, "`evaluate.modes[1]` must be one of ['greedy', 'sampled']"),
        ({"rollout": {"top_p": 1.5}}, "`top_p` must be in (0, 1]"),
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
