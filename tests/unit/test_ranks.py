"""`distributed.active()`: a rank of a launch, not any process group. vLLM's in-process CPU engine makes a world-1 gloo
group of its own; a local run under it must keep the single-process path (no FSDP2, prefix-shared scoring)."""

import torch.distributed as dist

from seed_core import distributed


def test_a_process_group_without_the_rank_environment_is_no_rank(tmp_path, monkeypatch):
    for k in distributed.RANK_ENV:
        monkeypatch.delenv(k, raising=False)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert not distributed.active() and distributed.world() == 1 and distributed.all_max(3) == 3
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", "1")
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        assert not distributed.active()  # MASTER_PORT still unset
        monkeypatch.setenv("MASTER_PORT", "29500")
        assert distributed.active() and distributed.world() == 1 and distributed.all_max(3) == 3
    finally:
        dist.destroy_process_group()
    assert not distributed.active()
