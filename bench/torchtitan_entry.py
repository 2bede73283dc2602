"""TorchTitan's own trainer as the peer of bench/torchtitan_peer.py: the rank entry that `torchrun` starts.

It runs `torchtitan.train.main(Trainer)`: TorchTitan's config parsing, its Trainer (meta build, parallelize_llama,
init_weights, its optimizer, scheduler, loss and metrics) and its training loop, unchanged. What is ours is glue:

- the model: TorchTitan's llama3 `Transformer`, registered under a train spec of ours (TorchTitan's public
  `register_train_spec`) whose one flavor is the shape the bench gives (the same shape Flywheel builds);
- the data: Flywheel's synthetic token stream in TorchTitan's `ParallelAwareDataloader`, so both train on the same
  samples in the same order (TorchTitan 0.2.2's wheel ships no dataset or tokenizer; `c4_test` is a repository path);
- the device on a machine without an accelerator (`use_cpu`): see its docstring;
- timing: a Trainer subclass notes the wall time after each `train_step` (after a CUDA synchronize on a GPU) and
  writes them, the phases of its start-up and its peak memory to a JSON file when TorchTitan closes the trainer.

    FLYWHEEL_TITAN_OUT=FILE FLYWHEEL_TITAN_SHAPE=JSON torchrun --nproc-per-node N -m bench.torchtitan_entry \
        <TorchTitan's CLI args>
"""

from __future__ import annotations

import time

BEGAN = time.time()  # before the imports: they are part of the start-up

import dataclasses  # noqa: E402  (after BEGAN, on purpose)
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from bench.torchtitan_cpu import sum_reductions_on_gloo, use_cpu_if_no_accelerator  # noqa: E402

FLAVOR = "peer"
SPEC_NAME = "flywheel_peer"


# Ours come by env: every argument is TorchTitan's (its ConfigManager.parse_args defaults to sys.argv[1:] as it was
# when torchtitan.config was imported).
OUT_ENV = "FLYWHEEL_TITAN_OUT"  # this rank's JSON file of times and memory (".rank<RANK>" appended)
SHAPE_ENV = "FLYWHEEL_TITAN_SHAPE"  # JSON: layers, dim, heads, kv_heads, ffn, vocab, rope_theta, seed


def model_args(shape: dict[str, Any]) -> Any:
    """TorchTitan's llama3 args for `shape`. Its MLP width is derived (multiple_of x ceil(int(8 dim / 3 x mult) /
    multiple_of)); multiple_of = ffn and a multiplier that puts int(...) at ffn - 1 give exactly `ffn`."""
    from torchtitan.models.llama3 import TransformerModelArgs

    base = int(2 * 4 * shape["dim"] / 3)
    return TransformerModelArgs(dim=shape["dim"], n_layers=shape["layers"], n_heads=shape["heads"],
                                n_kv_heads=shape["kv_heads"], vocab_size=shape["vocab"], multiple_of=shape["ffn"],
                                ffn_dim_multiplier=(shape["ffn"] - 0.5) / base, rope_theta=shape["rope_theta"])


def _dataloader_fn(shape: dict[str, Any]) -> Any:
    from torch.utils.data import IterableDataset
    from torchtitan.components.dataloader import ParallelAwareDataloader

    from flywheel.trainer.data import SyntheticSource

    class FlywheelSamples(IterableDataset):
        """Sample k of a dp rank at step s is Flywheel's s x global + rank x local + k (its SampleLoader's order)."""

        def __init__(self, seq_len: int, dp_rank: int, dp_size: int, local_batch: int) -> None:
            self.source = SyntheticSource(shape["vocab"], seq_len, shape["seed"])
            self.dp_rank, self.dp_size, self.local_batch = dp_rank, dp_size, local_batch

        def __iter__(self) -> Any:
            step = 0
            while True:
                first = step * self.dp_size * self.local_batch + self.dp_rank * self.local_batch
                for index in range(first, first + self.local_batch):
                    tokens = torch.from_numpy(self.source.sample(index))
                    yield {"input": tokens[:-1]}, tokens[1:]
                step += 1

    def build(dp_world_size: int, dp_rank: int, tokenizer: Any, job_config: Any, **_: Any) -> Any:
        local = job_config.training.local_batch_size
        data = FlywheelSamples(job_config.training.seq_len, dp_rank, dp_world_size, local)
        return ParallelAwareDataloader(data, dp_rank=dp_rank, dp_world_size=dp_world_size, batch_size=local)

    return build


def register(shape: dict[str, Any]) -> None:
    """TorchTitan's llama3 train spec with one flavor of our shape, our data and no tokenizer or validator; its own
    parallelize function, with sum-only reductions on gloo (bench/torchtitan_cpu.py says why)."""
    from torchtitan.protocols.train_spec import get_train_spec, register_train_spec

    llama3 = get_train_spec("llama3")
    register_train_spec(SPEC_NAME, dataclasses.replace(
        llama3, model_args={FLAVOR: model_args(shape)}, build_dataloader_fn=_dataloader_fn(shape),
        parallelize_fn=sum_reductions_on_gloo(llama3.parallelize_fn),
        build_tokenizer_fn=None, build_validator_fn=None))


def timed_trainer(out: Path, imports_s: float) -> type:
    from torchtitan.train import Trainer

    class TimedTrainer(Trainer):
        """TorchTitan's Trainer; records when its set-up ended and each step's end (wall clock)."""

        def __init__(self, job_config: Any) -> None:
            self.began_init = time.time()
            super().__init__(job_config)
            self.ended_init = time.time()
            self.step_ends: list[float] = []
            # Global sizes (DTensor numel): the bench checks the shape against Flywheel's parameter count.
            self.params = sum(p.numel() for m in self.model_parts for p in m.parameters())

        def train_step(self, data_iterator: Any) -> None:
            super().train_step(data_iterator)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.step_ends.append(time.time())

        def close(self) -> None:
            super().close()
            cuda = torch.cuda.is_available()
            record = {"began": BEGAN, "imports_s": imports_s, "init_began": self.began_init,
                      "init_ended": getattr(self, "ended_init", None), "step_ends": getattr(self, "step_ends", []),
                      "params": getattr(self, "params", None),
                      "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "cuda_max_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None,
                      "device": "cuda" if cuda else "cpu", "torchtitan": _version()}
            out.write_text(json.dumps(record))

    return TimedTrainer


def _version() -> str:
    from importlib.metadata import version

    return version("torchtitan")


def main() -> None:
    shape = json.loads(os.environ[SHAPE_ENV])
    device = use_cpu_if_no_accelerator()
    import torchtitan.train

    register(shape)
    out = Path(f"{os.environ[OUT_ENV]}.rank{os.environ.get('RANK', '0')}")
    trainer = timed_trainer(out, time.time() - BEGAN)
    print(f"torchtitan {_version()} on {device}", flush=True)
    torchtitan.train.main(trainer)


if __name__ == "__main__":
    main()
