"""Staging: copy a state dict's tensors into reusable CPU buffers, off the training thread.

Why not DCP's DefaultStager on CPU: its StateDictStager copies with `UntypedStorage.copy_`, which holds the GIL for
the whole copy (measured: the training thread got ~1/8 of its Python throughput during a 400 MB copy), so the copy
stalls the forward pass it is meant to overlap. `Tensor.copy_` releases the GIL. On CUDA the copies go
device -> pinned host memory on a side stream that first waits for the optimizer step's kernels.

One set of buffers is enough: the Checkpointer keeps one save in flight, and the next save starts only after the
previous write returned, so the buffers are free again by then (a second set would only double host memory).

`reserve` allocates (pins) and touches the buffers before the first save, at set-up: allocated by the first save
instead, they held the loop 0.3-0.5 s on CPU (page faults of the first copy) and 1.1-1.3 s on a GPU (pinning).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch.distributed.tensor import DTensor

from flywheel.torch_compat import dtensor_local, dtensor_with_local

Path = tuple[Any, ...]

if TYPE_CHECKING:
    from torch.distributed.tensor._dtensor_spec import DTensorSpec


class _DTensorConstructor(Protocol):
    def __call__(self, local_tensor: torch.Tensor, spec: DTensorSpec, *, requires_grad: bool) -> DTensor: ...


# DTensor's constructor (unannotated in torch): a local tensor under an existing spec, left where it is.
_dtensor_like: _DTensorConstructor = DTensor


class StagingBuffers:
    """CPU copies of every tensor in a state dict, kept between saves (keyed by position, shape and dtype)."""

    def __init__(self, *, pin_memory: bool) -> None:
        self.pin_memory = pin_memory
        self._buffers: dict[Path, torch.Tensor] = {}
        # Reserved before the first save, by shape and dtype: the first stage() takes them in place of new ones.
        self._reserved: dict[tuple[torch.Size, torch.dtype], list[torch.Tensor]] = {}

    @property
    def nbytes(self) -> int:
        reserved = [b for pool in self._reserved.values() for b in pool]
        return sum(b.numel() * b.element_size() for b in [*self._buffers.values(), *reserved])

    @torch.no_grad()
    def reserve(self, tensors: list[torch.Tensor]) -> None:
        """Allocate and touch a buffer for each of `tensors` (local shards; shapes and dtypes are what counts) that
        the state will hold, so that the first save finds its buffers ready. Buffers no save takes are freed by
        the first one. Once only: later calls keep what the first allocated."""
        if self._buffers or self._reserved:
            return
        for t in tensors:
            buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=self.pin_memory)
            buf.zero_()  # the pages' first touch happens here, not in the first save's copy
            self._reserved.setdefault((buf.shape, buf.dtype), []).append(buf)

    def _buffer_for(self, path: Path, src: torch.Tensor) -> torch.Tensor:
        buf = self._buffers.get(path)
        if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
            pool = self._reserved.get((src.shape, src.dtype))
            buf = pool.pop() if pool else torch.empty(src.shape, dtype=src.dtype, device="cpu",
                                                      pin_memory=self.pin_memory)
            self._buffers[path] = buf
        return buf

    @torch.no_grad()
    def stage(self, state_dict: dict[str, Any], stream: torch.cuda.Stream | None = None) -> dict[str, Any]:
        """A copy of state_dict whose tensors live in our CPU buffers. Runs on the staging thread."""
        seen: set[Path] = set()
        copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        staged: dict[str, Any] = self._rebuild(state_dict, (), copies, seen)
        for stale in set(self._buffers) - seen:  # the state's shape changed: free what no longer has a source
            del self._buffers[stale]
        self._reserved.clear()  # reserved for tensors the state does not hold
        if stream is None:
            for dst, src in copies:
                dst.copy_(src)
        else:
            with torch.cuda.stream(stream):
                for dst, src in copies:
                    dst.copy_(src, non_blocking=src.is_cuda)
            stream.synchronize()
        return staged

    def _rebuild(self, obj: Any, path: Path, copies: list[tuple[torch.Tensor, torch.Tensor]],
                 seen: set[Path]) -> Any:
        if isinstance(obj, DTensor):
            local = dtensor_local(obj).detach()
            buf = self._buffer_for(path, local)
            seen.add(path)
            copies.append((buf, local))
            # DTensor.from_local would move the buffer back to the mesh's device; keep the spec (global shape,
            # mesh, placements) and swap in the CPU shard, as DCP's own staging does.
            return dtensor_with_local(buf, obj)
        if isinstance(obj, torch.Tensor):
            src = obj.detach()
            buf = self._buffer_for(path, src)
            seen.add(path)
            copies.append((buf, src))
            return buf
        if isinstance(obj, dict):
            return {k: self._rebuild(v, path + (k,), copies, seen) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self._rebuild(v, path + (i,), copies, seen) for i, v in enumerate(obj)]
        if isinstance(obj, tuple):
            return tuple(self._rebuild(v, path + (i,), copies, seen) for i, v in enumerate(obj))
        return obj


@torch.no_grad()
def snapshot_unsafe_tensors(state: dict[str, Any], parameter_storages: set[int]) -> dict[str, Any]:
    """Clone now the model-state tensors that are not parameters (buffers: a forward may update them in place,
    e.g. BatchNorm running stats or DDP's buffer broadcast). They are small; parameters are staged later."""

    def visit(obj: Any) -> Any:
        if isinstance(obj, DTensor):
            if dtensor_local(obj).untyped_storage().data_ptr() in parameter_storages:
                return obj
            return dtensor_with_local(dtensor_local(obj).detach().clone(), obj)
        if isinstance(obj, torch.Tensor):
            if obj.untyped_storage().data_ptr() in parameter_storages:
                return obj
            return obj.detach().clone()
        if isinstance(obj, dict):
            return {k: visit(v) for k, v in obj.items()}
        return obj

    out = dict(state)
    out["model"] = visit(state["model"])
    return out
