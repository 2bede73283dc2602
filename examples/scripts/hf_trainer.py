"""A Hugging Face Trainer script as a team has it, plus the two lines that give Flywheel its steps and checkpoints.

A tiny GPT-2 built from a config here (nothing downloaded), trained on a fixed synthetic token stream with DDP over
gloo (CPU). Checkpoints every SAVE_STEPS steps into the job's checkpoint dir; after a restart it resumes from the
newest one (get_last_checkpoint), as such scripts do. Runs under `flywheel run examples/hf-trainer.yaml`, in a
TrainingJob's pods, or under plain `torchrun`.
"""

from __future__ import annotations

import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from flywheel.integrations.huggingface import FlywheelCallback, checkpoint_dir  # Flywheel: 1 of 2

STEPS = int(os.environ.get("HF_STEPS", "40"))
SAVE_STEPS = int(os.environ.get("HF_SAVE_STEPS", "10"))
SEQ, VOCAB, BATCH = 32, 256, 4


class TokenStream(torch.utils.data.Dataset):
    """The same samples on every run: a resumed run sees exactly the batches it would have."""

    def __init__(self, samples: int):
        generator = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, VOCAB, (samples, SEQ), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def main() -> None:
    output_dir = checkpoint_dir("runs/hf-trainer/ckpt")
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=64, n_layer=2, n_head=2))
    args = TrainingArguments(output_dir=output_dir, max_steps=STEPS, per_device_train_batch_size=BATCH,
                             learning_rate=1e-3, save_steps=SAVE_STEPS, save_total_limit=2, logging_steps=1,
                             ddp_backend="gloo", use_cpu=True, report_to=[], seed=0, dataloader_num_workers=0,
                             disable_tqdm=True, include_num_input_tokens_seen=True)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    trainer = Trainer(model=model, args=args, train_dataset=TokenStream(STEPS * BATCH * world),
                      callbacks=[FlywheelCallback()])  # Flywheel: 2 of 2
    last = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
    trainer.train(resume_from_checkpoint=last)


if __name__ == "__main__":
    main()
