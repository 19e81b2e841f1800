import os
import shutil
import subprocess
import sys

import pytest

from seed_core.envs.alfworld.data import (
    DataError,
    install,
    list_games,
    read_manifest,
    stratified_subset,
    task_type_of,
    verify,
    write_manifest,
)


def test_full_data_counts(alfworld_root):
    assert verify(alfworld_root) == {"train": 3553, "valid_seen": 140, "valid_unseen": 134}


def test_stratified_subset_is_deterministic_balanced_and_nested(alfworld_root):
    games = list_games(alfworld_root, "valid_seen")
    a = stratified_subset(games, 12, seed=3)
    assert a == stratified_subset(games, 12, seed=3) == sorted(a)
    counts = {}
    for g in a:
        counts[task_type_of(g)] = counts.get(task_type_of(g), 0) + 1
    assert sorted(counts.values()) == [2] * 6
    assert set(stratified_subset(games, 6, seed=3)) <= set(a)
    assert stratified_subset(games, 12, seed=4) != a
    with pytest.raises(DataError, match="only 140 are available"):
        stratified_subset(games, 141, seed=0)


@pytest.mark.fault("data", n=3)  # game changed, game missing, manifest missing
def test_manifest_hash_mismatch_is_refused(alfworld_root, tmp_path):
    root = tmp_path / "alf"
    gid = list_games(alfworld_root, "valid_seen")[0]
    src = alfworld_root / "json_2.1.1" / gid
    shutil.copytree(src, root / "json_2.1.1" / gid)
    manifest = tmp_path / "m.json"
    (entry,) = write_manifest(manifest, root, [gid])
    assert entry.task_type == task_type_of(gid) and entry.split == "valid_seen"
    assert read_manifest(manifest, root)[0] == entry
    game = root / "json_2.1.1" / gid / "game.tw-pddl"
    game.write_text(game.read_text().replace("desk", "dusk"))
    with pytest.raises(DataError, match="no longer matches manifest"):
        read_manifest(manifest, root)
    game.unlink()
    with pytest.raises(DataError, match="is missing from"):
        read_manifest(manifest, root)
    with pytest.raises(DataError, match="run the prepare stage"):
        read_manifest(tmp_path / "absent.json", root)


@pytest.mark.fault("data", n=2)  # no data, incomplete data
def test_missing_and_incomplete_data_say_both_fixes(tmp_path):
    with pytest.raises(DataError) as e:
        verify(tmp_path)
    assert "seed data alfworld" in str(e.value) and "--archive" in str(e.value)
    (tmp_path / "json_2.1.1" / "train").mkdir(parents=True)
    (tmp_path / "logic").mkdir()
    with pytest.raises(DataError, match="incomplete: found"):
        verify(tmp_path)


@pytest.mark.fault("data")
def test_truncated_archive_is_refused_and_leaves_nothing(tmp_path):
    bad = tmp_path / "bad.tgz"
    bad.write_bytes(b"\x1f\x8b\x08\x00garbage")
    root = tmp_path / "data"
    with pytest.raises(DataError, match="not a readable .tgz"):
        install(root, bad)
    assert not root.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["bad.tgz"]  # no staging folder left behind


@pytest.mark.e2e
def test_loading_a_game_leaves_the_games_folder_where_it_was(alfworld_root, tmp_path):
    # alfworld.info sets $ALFWORLD_DATA to ~/.cache/alfworld on import when it is unset; data_root() must still
    # answer .alfworld/ afterwards. A fresh interpreter, since this one may have imported alfworld already.
    game = list_games(alfworld_root, "valid_seen")[0]
    code = (
        "import os, sys; from pathlib import Path\n"
        "from seed_core.envs.alfworld.data import data_root\n"
        "from seed_core.envs.alfworld.env import AlfworldGame\n"
        f"AlfworldGame(Path({str(alfworld_root)!r}), {game!r})\n"
        "print('ALFWORLD_DATA' in os.environ, data_root(repo=Path('/r')))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ALFWORLD_DATA"} | {"HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "/r/.alfworld"]
