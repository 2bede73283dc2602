from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

torch.set_num_threads(1)


@pytest.fixture
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A real world-size-1 gloo process group in this process (the Checkpointer's groups need one)."""
    init_file = tmp_path_factory.mktemp("pg") / "init"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
