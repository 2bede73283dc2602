"""Shared pieces for the checkpoint tests: fakes for events/metrics/data, a tiny training setup, rank spawning."""

from __future__ import annotations

import faulthandler
import os
import random
import socket
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

from flywheel.spec.job import CheckpointSpec
from flywheel.trainer.checkpoint.manager import AppState, Checkpointer
from flywheel.trainer.ft.process_exit import exit_rank

DIM = 16
BATCH = 8


class FakeEvents:
    def __init__(self) -> None:
        self.emitted: list[tuple[str, dict[str, Any]]] = []

    def emit(self, event: str, **fields: Any) -> None:
        self.emitted.append((event, fields))

    def named(self, name: str) -> list[dict[str, Any]]:
        return [fields for event, fields in self.emitted if event == name]


class _Histogram:
    def __init__(self) -> None:
        self.values: list[float] = []

    def observe(self, value: float) -> None:
        self.values.append(value)


class _Gauge:
    value: float | None = None

    def set(self, value: float) -> None:
        self.value = value


class _Counter:
    value = 0

    def inc(self) -> None:
        self.value += 1


class _ReasonCounter(_Counter):
    """Counts every reason in `value` and each in `by_reason`."""

    def __init__(self) -> None:
        self.by_reason: dict[str, int] = {}

    def labels(self, *, reason: str) -> _ReasonCounter:
        self.by_reason[reason] = self.by_reason.get(reason, 0) + 1  # counted on labels(): inc() always follows
        return self

    def inc(self) -> None:
        self.value += 1


class FakeMetrics:
    def __init__(self) -> None:
        self.checkpoint_blocking_seconds = _Histogram()
        self.checkpoint_total_seconds = _Histogram()
        self.checkpoint_last_step = _Gauge()
        self.checkpoint_failures_total = _ReasonCounter()


class CountingData:
    """A data position: the batch at position p is a pure function of p (as flywheel's data module promises)."""

    def __init__(self) -> None:
        self.consumed_samples = 0

    def next_batch(self) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.consumed_samples)
        self.consumed_samples += BATCH
        return torch.randn(BATCH, DIM, generator=gen)

    def state_dict(self) -> dict[str, Any]:
        return {"consumed_samples": self.consumed_samples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.consumed_samples = int(state["consumed_samples"])


class TinyNet(nn.Module):
    """Dropout (torch RNG) and BatchNorm (a buffer the forward updates in place) make resume sensitive to both."""

    def __init__(self, layers: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(DIM, DIM), nn.BatchNorm1d(DIM), nn.ReLU(),
                                                  nn.Dropout(0.1)) for _ in range(layers))
        self.head = nn.Linear(DIM, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class MLP(nn.Module):
    """No buffers: FSDP2's sharding of parameters only."""

    def __init__(self, layers: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(DIM, DIM) for _ in range(layers))
        self.head = nn.Linear(DIM, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.head(x)


def make_app(seed: int, *, rank: int = 0, world_size: int = 1, model: nn.Module | None = None,
             fsdp: bool = False) -> tuple[AppState, CountingData]:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    model = model if model is not None else TinyNet()
    if fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world_size,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    data = CountingData()
    return AppState(model, optimizer, scheduler, data, rank=rank, world_size=world_size), data


def train_step(app: AppState, data: CountingData, checkpointer: Any = None) -> float:
    """One step; python and numpy RNG enter the loss so a wrong RNG restore shows in the continuation."""
    x = data.next_batch()
    scale = 1.0 + 1e-3 * (random.random() + float(np.random.rand()))
    loss = app.model(x).pow(2).mean() * scale
    loss.backward()
    if checkpointer is not None:
        checkpointer.wait_staged()
    app.optimizer.step()
    app.scheduler.step()
    app.optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def full_state(app: AppState) -> dict[str, Any]:
    """Full (unsharded) model and optimizer state, detached copies; a collective under FSDP."""
    opts = StateDictOptions(full_state_dict=True)
    model = {k: v.detach().clone() for k, v in get_model_state_dict(app.model, options=opts).items()}
    optim = get_optimizer_state_dict(app.model, app.optimizer, options=opts)
    state = {fqn: {k: (v.detach().clone() if isinstance(v, torch.Tensor) else v) for k, v in s.items()}
             for fqn, s in optim["state"].items()}
    return {"model": model, "optim": state, "lr": [g["lr"] for g in app.optimizer.param_groups]}


def assert_same_state(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), f"model tensor {key} differs"
    assert a["optim"].keys() == b["optim"].keys()
    for fqn in a["optim"]:
        for k, v in a["optim"][fqn].items():
            other = b["optim"][fqn][k]
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(other)), f"optimizer {fqn}.{k} differs"
    assert a["lr"] == b["lr"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A rank still running after this long is stuck (a run takes seconds, ~15 s on a loaded 2-core machine): it prints
# every thread's stack and exits, so the test fails with where it waited instead of at pytest's 600 s timeout with
# the parent's stack only (a CI run saw one such hang, of the disk restore after both hosts' memory was lost).
STUCK_RANK_SECONDS = 240


def _rank_main(rank: int, fn: Callable[..., None], world_size: int, init_file: str, args: tuple[Any, ...]) -> None:
    faulthandler.dump_traceback_later(STUCK_RANK_SECONDS, exit=True)
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()
    exit_rank(0)  # a failure above still reaches mp.spawn through its error file


def run_ranks(fn: Callable[..., None], world_size: int, tmp: str, *args: Any) -> None:
    """Run fn(rank, world_size, *args) on world_size gloo ranks; raises if any rank fails."""
    init_file = os.path.join(tmp, f"pg-init-{world_size}-{free_port()}")
    mp.spawn(_rank_main, args=(fn, world_size, init_file, args), nprocs=world_size, join=True)


# ---- two workers with the memory tier: each rank its own host's memory ----------------------------------------------


def memory_worker(rank: int, world_size: int, root: str) -> tuple[AppState, CountingData, Checkpointer]:
    """A rank of a job saving to disk every 4 steps and to memory every step, its worker's host memory
    root/shm/worker-<rank> (one worker per rank)."""
    app, data = make_app(seed=0, rank=rank, world_size=world_size, model=MLP(), fsdp=True)
    host = Path(root) / "shm" / f"worker-{rank}"
    cfg = CheckpointSpec(dir=root, every_steps=4, memory_every_steps=1, keep=2)
    return app, data, Checkpointer(cfg, root, events=FakeEvents(), memory_dir=host)


def train_saving(app: AppState, data: Any, ckpt: Checkpointer, steps: int) -> None:
    """Train `steps` steps, saving each due one and waiting for its memory copy."""
    assert ckpt.memory is not None
    for step in range(1, steps + 1):
        train_step(app, data, ckpt)
        if ckpt.due(step):
            ckpt.save(step, app)
            ckpt.memory.wait()


def save_memory_steps(rank: int, world_size: int, root: str) -> None:
    """Train 8 steps saving until step 6 (disk: step 4; memory: step 6); rank 0 keeps the state at step 6 and at
    the end in root/expected.pt, what a resume must give."""
    app, data, ckpt = memory_worker(rank, world_size, root)
    assert ckpt.memory is not None
    for step in range(1, 9):
        train_step(app, data, ckpt)
        if step == 6:
            at_6 = full_state(app)
        if ckpt.due(step) and step <= 6:
            ckpt.save(step, app)
            ckpt.memory.wait()
    final = full_state(app)
    ckpt.close()
    if rank == 0:
        torch.save({"at_6": at_6, "final": final}, Path(root) / "expected.pt")


def train_on_to_step_8(app: AppState, data: CountingData, ckpt: Checkpointer, restored_step: int) -> None:
    """After a restore of `restored_step` from save_memory_steps' run: its state at step 6 when that step was
    restored, then trained on to step 8, the state equals the run's (rank 0's root/expected.pt)."""
    expected = torch.load(Path(ckpt.directory) / "expected.pt", weights_only=False)
    if restored_step == 6:
        assert_same_state(full_state(app), expected["at_6"])
    for _ in range(restored_step, 8):
        train_step(app, data, ckpt)
    ckpt.close()
    assert_same_state(full_state(app), expected["final"])


def flip_byte(path: Path, offset: int) -> None:
    """Damage a file after it was written: one bit of the byte at `offset` flipped in place."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))
