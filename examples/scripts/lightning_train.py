"""A Lightning script as a team has it, plus the two lines that give Flywheel its steps and checkpoints.

A small regression model on a fixed synthetic dataset, DDP over gloo on the CPU (Lightning reads the ranks from the
torch elastic environment that `flywheel launch` or `torchrun` sets). A ModelCheckpoint every SAVE_STEPS steps into
the job's checkpoint dir; after a restart `fit(ckpt_path=...)` resumes from the newest. Runs under
`flywheel run examples/lightning.yaml`, in a TrainingJob's pods, or under plain `torchrun`.
"""

from __future__ import annotations

import os
from pathlib import Path

import lightning as L
import torch
from torch import nn

from flywheel.integrations.lightning import FlywheelCallback, checkpoint_dir  # Flywheel: 1 of 2

STEPS = int(os.environ.get("LIGHTNING_STEPS", "40"))
SAVE_STEPS = int(os.environ.get("LIGHTNING_SAVE_STEPS", "10"))
BATCH, FEATURES = 16, 32


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def dataset(samples: int) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(samples, FEATURES, generator=generator)
    return torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True) / FEATURES)


def newest_checkpoint(folder: Path) -> str | None:
    saved = sorted(folder.glob("step=*.ckpt"), key=lambda p: int(p.stem.split("=")[1]))
    return str(saved[-1]) if saved else None


def main() -> None:
    folder = Path(checkpoint_dir("runs/lightning/ckpt"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    nodes = world // per_node
    saves = L.pytorch.callbacks.ModelCheckpoint(dirpath=folder, filename="{step}", every_n_train_steps=SAVE_STEPS,
                                                save_top_k=-1)
    trainer = L.Trainer(max_steps=STEPS, accelerator="cpu", devices=per_node, num_nodes=nodes,
                        strategy="ddp_find_unused_parameters_false" if world > 1 else "auto",
                        callbacks=[saves, FlywheelCallback()],  # Flywheel: 2 of 2
                        logger=False, enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1)
    loader = torch.utils.data.DataLoader(dataset(STEPS * BATCH * world), batch_size=BATCH)
    trainer.fit(Regression(), loader, ckpt_path=newest_checkpoint(folder))


if __name__ == "__main__":
    main()
