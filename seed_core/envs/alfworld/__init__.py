"""ALFWorld: game data and manifests (`data`), the environment (`env`), the oracle teacher, and expert replay."""

from __future__ import annotations

from pathlib import Path

from seed_core.envs import GameEntry
from seed_core.envs.alfworld.data import EXPECTED_COUNTS, TASK_TYPES
from seed_core.runtime import derive_seed


class Alfworld:
    """The `Environment` of real ALFWorld games under `data_root` (the params value, else $ALFWORLD_DATA, else
    `.alfworld/`)."""

    name = "alfworld"
    task_types = dict(zip(TASK_TYPES, ("pick", "look", "clean", "heat", "cool", "pick2")))  # the paper's columns
    sdar_skills = "recipes/sdar_skills_alfworld.yaml"
    closed_actions = False  # the game answers an inadmissible command itself ("Nothing happens.")

    @classmethod
    def check_params(cls, params) -> None:
        from seed_core.config import require

        prep, env = params.prepare, params.env
        for k, split in (
            ("train_games", "train"),
            ("valid_seen_games", "valid_seen"),
            ("valid_unseen_games", "valid_unseen"),
        ):
            v, cap = getattr(prep, k), EXPECTED_COUNTS[split]
            require(v == -1 or 1 <= v <= cap, f"prepare.{k}", f"must be -1 (whole split) or 1..{cap}, got {v}")
        train = EXPECTED_COUNTS["train"]
        require(0 <= prep.warmup_games <= train, "prepare.warmup_games", f"must be 0..{train}, got {prep.warmup_games}")
        if prep.train_games != -1:
            require(
                prep.train_games + prep.warmup_games <= train,
                "prepare.warmup_games",
                f"plus prepare.train_games must fit in the {train} training games (they are disjoint)",
            )
        require(
            env.observation == "text",
            "env.observation",
            f"is {env.observation!r}, but only Sokoban renders images; set it to text for env.name {env.name!r}",
        )
        require(
            env.alfworld.hosts == "local" or env.workers >= 1,
            "env.alfworld.hosts",
            f"is ray, which hosts ALFWorld's workers (env.workers >= 1); got env.name {env.name!r} with "
            f"env.workers {env.workers}",
        )
        for key, claims in (
            ("teacher.oracle_claims", params.teacher.oracle_claims),
            ("rl.oracle_claims", params.rl.oracle_claims),
        ):
            require(
                claims == "solver",
                key,
                f"is {claims!r}, but only Sokoban's oracle separates what an episode shows from what its solver knows "
                f"(env.name is {env.name!r}); set {key}: solver",
            )

    @classmethod
    def from_params(cls, params) -> Alfworld:
        return cls(params.data.alfworld_data, params.env.alfworld.hosts, params.env.alfworld.ray_address)

    @staticmethod
    def step_prompt(env, task: str, observation: str, actions: list[str], history: list[tuple[str, str]]) -> str:
        from seed_core.envs.alfworld.prompts import step_prompt

        return step_prompt(task, observation, actions, history, env.history_length)

    @staticmethod
    def render(env, observation: str) -> None:
        """ALFWorld is text only (`check_params` refuses an image view)."""
        return None

    def __init__(self, configured_root: str | None = None, hosts: str = "local", ray_address: str | None = None):
        from seed_core.envs.alfworld.data import data_root

        self.root = data_root(configured_root)
        self.hosts, self.ray_address = hosts, ray_address  # where `open_pool`'s workers run (`env.alfworld.hosts`)
        self._facts_oracle = None  # reads each game file once for `key_names`

    def write_manifests(self, cfg, manifest_dir: Path) -> dict[str, int]:
        """Task-type-stratified, seeded, sorted subsets of ALFWorld's splits; `warmup` is drawn from the training
        games left after `train`, so the behaviour-cloning games are never RL games."""
        from seed_core.envs.alfworld.data import list_games, stratified_subset, verify, write_manifest

        verify(self.root)
        train_pool = list_games(self.root, "train")
        train = stratified_subset(train_pool, cfg.train_games, cfg.seed)
        warmup = (
            stratified_subset(train_pool, cfg.warmup_games, derive_seed(cfg.seed, 1, stride=1), exclude=set(train))
            if cfg.warmup_games
            else []
        )
        chosen = {
            "train": train,
            "warmup": warmup,
            "valid_seen": stratified_subset(list_games(self.root, "valid_seen"), cfg.valid_seen_games, cfg.seed),
            "valid_unseen": stratified_subset(list_games(self.root, "valid_unseen"), cfg.valid_unseen_games, cfg.seed),
        }
        for name, games in chosen.items():
            write_manifest(Path(manifest_dir) / f"{name}.json", self.root, games)
        return {k: len(v) for k, v in chosen.items()}

    def read_manifest(self, path: Path) -> list[GameEntry]:
        from seed_core.envs.alfworld.data import read_manifest

        return read_manifest(Path(path), self.root)

    def open_pool(self, workers: int):
        from seed_core.envs.alfworld.env import EnvPool, RayEnvPool

        return RayEnvPool(self.root, workers, self.ray_address) if self.hosts == "ray" else EnvPool(self.root, workers)

    def expert_examples(self, entries: list[GameEntry], env, progress: bool = True) -> list[dict]:
        from seed_core.envs.alfworld.expert import expert_examples

        return expert_examples(self.root, entries, env, progress)

    def oracle(self, max_chars: int | None = None, claims: str = "solver"):
        from seed_core.envs.alfworld.oracle import OracleTeacher

        if claims != "solver":  # params check this too; a direct caller gets the same answer
            raise ValueError(f"ALFWorld's oracle writes from the expert's plan only (claims 'solver'), got {claims!r}")
        return OracleTeacher(self.root, max_chars)

    def step_labels(self, traj) -> None:
        """No solver judges ALFWorld steps: the credit probe needs Sokoban."""
        return None

    def check_skill(self, traj, skill) -> None:
        """No solver to check an ALFWorld skill's claims against (`key_names` is the nearest check)."""
        return None

    def key_names(self, traj) -> list[str]:
        """Receptacles where an instance of the task's target object starts, from the game file."""
        self._facts_oracle = self._facts_oracle or self.oracle()
        facts = self._facts_oracle.game_facts(traj.game_id, traj.task_type)
        return sorted({r for _, r in facts.instances_of(facts.target)})

    def perception_examples(self, entries, env, progress: bool = True) -> list[dict]:
        raise ValueError("ALFWorld shows no images: there is nothing for a perception warm-up to learn")

    def source(self) -> dict[str, str]:
        return {"alfworld_data": str(self.root)}
