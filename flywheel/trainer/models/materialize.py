"""Meta-device initialisation: the model is built on the meta device (`build_model(..., device=META)`: shapes, no
memory), parallelised (tensor parallel, expert parallel, FSDP2 sharding, pipeline stages all work on meta tensors),
then materialised here: `to_empty` allocates only this rank's parameters (its shards, its stages) on the real
device, and each is filled with its region of the value the plain model would have had.

The values are bitwise those of `GPT(cfg, seed)` / `Llama(cfg, seed)` built on CPU: the model's `init_plan()`
lists every parameter's init in generator order, and it is replayed here with the same generator. A rank draws
every full tensor in turn (the generator's position depends on all earlier draws), a block of rows at a time, and
keeps only its slice of each: host memory peaks at this rank's parameters plus one block (`row_blocks`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from flywheel.layout.shape import ModelShape
from flywheel.trainer.models.gpt.model import initial_value
from flywheel.trainer.models.hf_weights import clean_name
from flywheel.trainer.models.registry import build_model
from flywheel.trainer.startup import CLOCK

META = torch.device("meta")
CHUNK_ELEMENTS = 1 << 22  # drawn at a time (16 MiB in fp32)


def is_meta(module: nn.Module) -> bool:
    return any(p.is_meta for p in module.parameters())


def _local_region(param: torch.Tensor) -> tuple[torch.Tensor, tuple[slice, ...]]:
    """This rank's tensor to fill and the region of the global tensor it holds."""
    if isinstance(param, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
        return param.to_local(), tuple(slice(o, o + s) for o, s in zip(offset, shape))
    return param, tuple(slice(0, s) for s in param.shape)


@torch.no_grad()
def materialize(module: nn.Module, cfg: ModelShape, seed: int, device: torch.device) -> None:
    """Allocates `module`'s parameters (a whole model or pipeline stage, sharded or not, named like the plain
    model but for wrapper prefixes) on `device` and fills them with the plain model's initial values for `seed`."""
    with CLOCK.part("materialize"):  # a start-up phase of its own, within parallelize
        _materialize(module, cfg, seed, device)


def _materialize(module: nn.Module, cfg: ModelShape, seed: int, device: torch.device) -> None:
    module.to_empty(device=device)
    held: dict[str, list[torch.Tensor]] = {}
    for raw_name, param in module.named_parameters():
        name = clean_name(raw_name)
        if name == "head.weight" and cfg.tied_embeddings:
            # A pipeline's last stage holds its own copy of the tied embedding; `to_empty` may also have untied
            # a same-module tie (one new tensor per module), retied below.
            name = "tok_emb.weight"
        held.setdefault(name, []).append(param)
    plain = build_model(cfg, device=META)  # the order and the shapes, without memory
    shapes = dict(plain.named_parameters())
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for name, kind, std in plain.init_plan():
        targets = [_local_region(target) for target in held.pop(name, [])]
        shape = shapes[name].shape
        if kind == "normal" and shape:
            _fill_normal_by_rows(targets, shape, std, gen)
        elif targets:  # ones and zeros draw nothing
            value = initial_value(kind, std, shape, gen)
            for local, region in targets:
                local.copy_(value[region].to(local.dtype))
    if held:
        raise AssertionError(f"parameters without an initial value: {sorted(held)}")
    _retie(module, cfg)


def row_blocks(shape: torch.Size) -> Iterator[tuple[int, int]]:
    """Row ranges [start, end) covering dimension 0, each of about CHUNK_ELEMENTS elements and a multiple of 16
    (the last one up to twice that). CPU `normal_` draws its uniforms in sequence, transforms them in blocks of
    16 and redraws the last 16 when the size is no multiple of 16, so drawing such pieces one after the other
    gives bitwise the values of one draw of the whole tensor (test_meta_init pins it) without holding it."""
    rows, row = shape[0], math.prod(shape[1:])
    step = 16 // math.gcd(row, 16)
    per = max(step, CHUNK_ELEMENTS // max(row, 1) // step * step)
    start = 0
    while start < rows:
        end = rows if rows - start < 2 * per else start + per
        yield start, end
        start = end


def _fill_normal_by_rows(targets: list[tuple[torch.Tensor, tuple[slice, ...]]], shape: torch.Size, std: float,
                         gen: torch.Generator) -> None:
    if targets and all(_whole_fp32(local, region, shape) for local, region in targets):
        # Whole tensors (one process, DDP; a tied head's copy beside its embedding): draw into the first, block by
        # block, rather than into blocks copied out (a row range of a contiguous tensor is contiguous: the same
        # draws), and copy it to the others.
        first = targets[0][0]
        for start, end in row_blocks(shape):
            first[start:end].normal_(0.0, std, generator=gen)
        for local, _ in targets[1:]:
            local.copy_(first)
        return
    for start, end in row_blocks(shape):
        block = torch.empty((end - start, *shape[1:]), dtype=torch.float32, device="cpu")
        block.normal_(0.0, std, generator=gen)
        for local, region in targets:
            lo, hi = max(start, region[0].start), min(end, region[0].stop)
            if lo < hi:
                rows = slice(lo - region[0].start, hi - region[0].start)
                local[rows].copy_(block[(slice(lo - start, hi - start), *region[1:])].to(local.dtype))


def _whole_fp32(local: torch.Tensor, region: tuple[slice, ...], shape: torch.Size) -> bool:
    return (local.dtype == torch.float32 and local.device.type == "cpu" and local.is_contiguous()
            and tuple(local.shape) == tuple(shape) and all(r.start == 0 and r.stop == n for r, n in zip(region, shape)))


def _retie(module: nn.Module, cfg: ModelShape) -> None:
    """`to_empty` gives each module its own new tensor: a head tied to the embedding inside one module is tied
    again (a pipeline stage without the embedding keeps its untied copy)."""
    tok_emb, head = getattr(module, "tok_emb", None), getattr(module, "head", None)
    if cfg.tied_embeddings and tok_emb is not None and head is not None and head.weight is not tok_emb.weight:
        head.register_parameter("weight", tok_emb.weight)
