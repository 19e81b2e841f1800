"""ALFWorld game data: install, verify, list, and task manifests.

The manifests written by `prepare` are the only way later stages find games: a fixed, sorted list of game
ids with the sha256 of each game file, so a run never depends on a folder walk's order and never silently
plays a game that changed on disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import tarfile
import tempfile
from collections import defaultdict
from pathlib import Path

from seed_core.envs import GameEntry
from seed_core.records import DataError, write_json

SPLITS = ("train", "valid_seen", "valid_unseen")
EXPECTED_COUNTS = {"train": 3553, "valid_seen": 140, "valid_unseen": 134}
TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
GAME_FILE = "game.tw-pddl"
REPO_DATA_DIR = ".alfworld"


def how_to_install(root: Path) -> str:
    return (
        f"install the ALFWorld games into {root} with `seed data alfworld` (runs `alfworld-download` when "
        "online), or offline from an archive: `seed data alfworld --archive PATH/alfworld_data.tgz` "
        "(or set ALFWORLD_ARCHIVE=PATH)"
    )


def data_root(configured: str | None = None, repo: Path | None = None) -> Path:
    """Where the games live: the params value, else $ALFWORLD_DATA, else `.alfworld/` in the repository."""
    if configured:
        return Path(configured).expanduser().resolve()
    if os.environ.get("ALFWORLD_DATA"):
        return Path(os.environ["ALFWORLD_DATA"]).expanduser().resolve()
    return ((repo or Path.cwd()) / REPO_DATA_DIR).resolve()


def import_alfworld() -> None:
    """Import alfworld without its side effect on `data_root`: `alfworld.info` sets $ALFWORLD_DATA to
    ~/.cache/alfworld when it is unset, so every later `data_root()` in this process would point there instead
    of at `.alfworld/`. Call before any other alfworld import (the module runs once per process)."""
    before = os.environ.get("ALFWORLD_DATA")
    import alfworld.info  # noqa: F401

    if before is None:
        os.environ.pop("ALFWORLD_DATA", None)


def task_type_of(game_id: str) -> str:
    """The task type from the game folder name (`<task_type>-<object>-...`)."""
    folder = game_id.split("/")[1]
    for t in TASK_TYPES:
        if folder.startswith(t + "-"):
            return t
    raise DataError(f"game {game_id} does not start with a known task type {list(TASK_TYPES)}")


def list_games(root: Path, split: str) -> list[str]:
    """Sorted game ids (`<split>/<task folder>/<trial>`) of one split, with ALFWorld's own filters.

    Like `AlfredTWEnv`, skips 'movable' and 'Sliced' tasks and games marked unsolvable, which is what makes
    the counts 3553 / 140 / 134.
    """
    base = root / "json_2.1.1" / split
    if not base.is_dir():
        return []
    games = []
    for game_file in base.glob(f"*/*/{GAME_FILE}"):
        trial = game_file.parent
        if "movable" in str(trial) or "Sliced" in str(trial) or not (trial / "traj_data.json").exists():
            continue
        if not json.loads(game_file.read_text()).get("solvable", False):
            continue
        games.append(f"{split}/{trial.parent.name}/{trial.name}")
    return sorted(games)


def verify(root: Path) -> dict[str, int]:
    """Count each split's games; raise DataError saying how to fix it unless they are 3553 / 140 / 134."""
    if not (root / "json_2.1.1").is_dir() or not (root / "logic").is_dir():
        raise DataError(f"no ALFWorld data in {root} (json_2.1.1/ and logic/ missing); {how_to_install(root)}")
    counts = {s: len(list_games(root, s)) for s in SPLITS}
    if counts != EXPECTED_COUNTS:
        raise DataError(
            f"ALFWorld data in {root} is incomplete: found {counts}, expected {EXPECTED_COUNTS}; "
            f"delete the folder and {how_to_install(root)}"
        )
    return counts


def install(root: Path, archive: str | os.PathLike | None = None) -> dict[str, int]:
    """Make `root` a complete ALFWorld data folder and return its split counts.

    With an archive (argument or $ALFWORLD_ARCHIVE) it is unpacked into a temporary folder next to `root`
    and moved into place only once complete, so an interrupted install never leaves a half tree. Without
    one, `alfworld-download` fetches the official release.
    """
    try:
        return verify(root)
    except DataError:
        pass
    archive = archive or os.environ.get("ALFWORLD_ARCHIVE")
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        if archive:
            archive = Path(archive)
            if not archive.is_file():
                raise DataError(f"archive {archive} does not exist; {how_to_install(root)}")
            try:
                with tarfile.open(archive) as tf:
                    tf.extractall(staging, filter="data")
            except (tarfile.TarError, EOFError, OSError) as e:
                raise DataError(f"archive {archive} is not a readable .tgz ({e}); {how_to_install(root)}") from e
        else:
            exe = shutil.which("alfworld-download")
            if exe is None:
                raise DataError(f"`alfworld-download` is not installed; {how_to_install(root)}")
            proc = subprocess.run([exe, "--data-dir", str(staging)], capture_output=True, text=True)
            if proc.returncode != 0:
                raise DataError(
                    f"`alfworld-download` failed ({proc.stderr.strip()[-300:]}); offline, use an archive: "
                    f"{how_to_install(root)}"
                )
        counts = verify(staging)
        if root.exists():
            shutil.rmtree(root)
        staging.rename(root)
        return counts
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def game_path(root: Path, game_id: str) -> Path:
    return root / "json_2.1.1" / game_id / GAME_FILE


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def stratified_subset(games: list[str], n: int, seed: int, exclude: set[str] = frozenset()) -> list[str]:
    """`n` games spread evenly over the task types (round-robin over types), deterministic in `seed`.

    -1 takes every game. Within a type the order is a seeded shuffle of the sorted list, so the same
    (games, n, seed) always gives the same subset, and a larger n extends a smaller one.
    """
    pool = [g for g in games if g not in exclude]
    if n == -1:
        return sorted(pool)
    if n > len(pool):
        raise DataError(f"asked for {n} games but only {len(pool)} are available")
    by_type: dict[str, list[str]] = defaultdict(list)
    for g in pool:
        by_type[task_type_of(g)].append(g)
    rng = random.Random(seed)
    queues = []
    for t in TASK_TYPES:
        q = sorted(by_type.get(t, []))
        rng.shuffle(q)
        queues.append(q)
    picked: list[str] = []
    while len(picked) < n:
        for q in queues:
            if q and len(picked) < n:
                picked.append(q.pop(0))
    return sorted(picked)


def write_manifest(path: Path, root: Path, game_ids: list[str]) -> list[GameEntry]:
    entries = [
        GameEntry(g, g.split("/")[0], task_type_of(g), sha256_file(game_path(root, g))) for g in sorted(game_ids)
    ]
    write_json(path, {"games": [e.__dict__ for e in entries]})
    return entries


def read_manifest(path: Path, root: Path, check_hashes: bool = True) -> list[GameEntry]:
    """The games of a manifest, each checked to exist with the recorded sha256."""
    if not Path(path).exists():
        raise DataError(f"manifest {path} does not exist; run the prepare stage (`dvc repro prepare`)")
    entries = [GameEntry(**e) for e in json.loads(Path(path).read_text())["games"]]
    if check_hashes:
        for e in entries:
            p = game_path(root, e.game_id)
            if not p.exists():
                raise DataError(f"game {e.game_id} of manifest {path} is missing from {root}; {how_to_install(root)}")
            if sha256_file(p) != e.sha256:
                raise DataError(
                    f"game file {p} no longer matches manifest {path} (sha256 differs); reinstall the data "
                    "(`seed data alfworld --force`) or re-run prepare (`dvc repro prepare`) to record the new games"
                )
    return entries
