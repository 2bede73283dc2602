"""A small tokenizer and corpus built here (no downloads): BPE trained with `tokenizers` on seeded sentences."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = ("the cat dog bird runs jumps sleeps eats over under near a small big red green quick lazy river tree "
         "house sun moon and then later fast slow").split()
EOS = "<|endoftext|>"


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) + "." for _ in range(n)]


def train_tokenizer(path: Path, vocab: int = 300) -> Path:
    """A byte-level BPE tokenizer.json of `vocab` tokens (end-of-text included) trained on the corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(sentences(400), trainer=trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return path


def write_corpus(root: Path, lines: int = 300) -> list[Path]:
    """A .txt and a .jsonl file of the corpus."""
    root.mkdir(parents=True, exist_ok=True)
    text, jsonl = root / "a.txt", root / "b.jsonl"
    text.write_text("\n".join(sentences(lines, seed=1)) + "\n")
    jsonl.write_text("".join(json.dumps({"text": s}) + "\n" for s in sentences(lines, seed=2)))
    return [text, jsonl]
