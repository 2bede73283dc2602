"""The memory tier: every memory save keeps this rank's staged state in host shared memory, and a replica of it in
a peer worker's (tiers/peer.py), so that a restart restores without reading the shared filesystem.

    <root>/own-rank-00003/step-00000040-w4.bin      rank 3's state after step 40, saved at world size 4
    <root>/replica-rank-00001/step-00000040-w4.bin  rank 1's, received from the worker before this one

(the step file's layout, and how a restore reads it straight into the live tensors: tiers/memory_file.py)

<root> is /dev/shm/flywheel-<job>-<hash of the checkpoint dir>/replica-<worker> (contracts/memory_root.py): it
outlives a rank's restart in place (the worker's processes come back on the same host), not the loss of the pod or
node; the peer's replica covers that. The root records the identity of the checkpoint dir whose copies it holds
(contracts/memory_root.py): an earlier run's copies, under the same job name after its dir was deleted, are wiped
instead of restored. A file is written under a temporary name and renamed, so a present file is complete (a write
that fails deletes its temporary file; one left by a killed rank goes when the next save starts). After a save
every rank agrees that it is complete everywhere before the other steps are deleted: each rank holds its newest
complete step and one replica. While a save is under way, or after one that was not complete everywhere, it holds
two of each: that step's and the newest complete one's, so /dev/shm needs room for about four times a worker's
share of the state (twice with one worker: no replicas).

What is kept is this rank's local view of the state dict (a DTensor's local shard), so it restores only at the
same world size and layout; at another world size the restore falls back to disk. The plan of a restore is a pure
function over every rank's inventory (plan_restore).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch.distributed.tensor import DTensor

from flywheel.contracts.memory_root import memory_root
from flywheel.torch_compat import dtensor_local
from flywheel.trainer.checkpoint.tiers import memory_file as step_format

__all__ = ["memory_root"]  # contracts/memory_root.py: where the copies live
_STEP_FILE = re.compile(r"^step-(\d{8,})-w(\d+)\.bin$")


def own_dir(root: Path, rank: int) -> Path:
    return root / f"own-rank-{rank:05d}"


def replica_dir(root: Path, src: int) -> Path:
    return root / f"replica-rank-{src:05d}"


# ---- the bytes of one rank's state --------------------------------------------------------------------------------


def save_file(folder: Path, step: int, world_size: int, rank: int, staged: dict[str, Any]) -> Path:
    """This rank's state (DTensors as their local shards) with what a restore checks, written as a step file
    (tiers/memory_file.py; temporary name, then renamed: a present step file is complete)."""
    folder.mkdir(parents=True, exist_ok=True)
    target = step_file(folder, step, world_size)
    tmp = temp_file(target)
    try:
        step_format.write(tmp, step, world_size, rank, local_view(staged))
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a partial file (e.g. /dev/shm full) would hold the space every later save needs
        raise
    return target


def local_view(obj: Any) -> Any:
    if isinstance(obj, DTensor):
        return dtensor_local(obj)
    if isinstance(obj, dict):
        return {k: local_view(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [local_view(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(local_view(v) for v in obj)
    return obj


# ---- files ----------------------------------------------------------------------------------------------------------


def step_file(folder: Path, step: int, world_size: int) -> Path:
    return folder / f"step-{step:08d}-w{world_size}.bin"


def temp_file(target: Path) -> Path:
    """Where a step file is written before it is renamed into place."""
    return target.parent / f".{target.name}.tmp"


def steps_in(folder: Path) -> dict[int, tuple[int, int]]:
    """Complete step files in a folder: step -> (bytes, world size). A missing folder has none."""
    try:
        entries = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return {}
    found = {}
    for entry in entries:
        match = _STEP_FILE.match(entry.name)
        if match:
            try:
                found[int(match.group(1))] = (entry.stat().st_size, int(match.group(2)))
            except FileNotFoundError:
                continue  # deleted since listed (another local rank's discard): not held
    return found


def keep_only(folder: Path, keep: set[int]) -> None:
    """Delete the step files other than `keep`'s, whatever their world size, and every temporary file. A step newer
    than those kept is from before a restore to an older step (a lineage since abandoned), so it goes too."""
    for step, (_, world_size) in steps_in(folder).items():
        if step not in keep:
            step_file(folder, step, world_size).unlink(missing_ok=True)
    drop_temporary(folder)


def drop_temporary(folder: Path) -> None:
    """Delete the temporary files of writes that did not finish (a failed save, a rank killed mid-write)."""
    for entry in folder.glob(".step-*.tmp") if folder.is_dir() else []:
        entry.unlink(missing_ok=True)


def folder_bytes(folder: Path) -> int:
    """Bytes of a folder's step files and temporary files (a write under way, or one left by a failure)."""
    total = sum(nbytes for nbytes, _ in steps_in(folder).values())
    for entry in folder.glob(".step-*.tmp") if folder.is_dir() else []:
        with contextlib.suppress(FileNotFoundError):
            total += entry.stat().st_size
    return total


def held_bytes(root: Path) -> int:
    """Bytes of every memory copy this worker's root holds (all its ranks' own copies and replicas)."""
    return sum(folder_bytes(folder) for folder in copy_folders(root))


def copies_outlive(replicas: list[str], per_worker: int, moving: set[str]) -> bool:
    """Whether every rank's memory copy outlives moving the workers `moving` (replica ids) to new pods.

    `replicas[r]`: rank r's worker. A moved worker's pod and its shared memory go, so a rank's copies are kept only
    while its own worker or the one holding its replica (the ring: rank r + per_worker) stays."""
    world_size = len(replicas)
    per_worker = max(1, min(per_worker, world_size))
    return all(replicas[r] not in moving or replicas[(r + per_worker) % world_size] not in moving
               for r in range(world_size))


def layout_folders(rank: int, world_size: int, per_worker: int) -> set[str]:
    """The names of the folders this rank's worker holds at this layout: its ranks' own copies and the replicas
    of their sources (ranks are numbered worker by worker, per_worker each, as the ring assumes)."""
    first = rank - rank % per_worker
    names = set()
    for r in range(first, min(first + per_worker, world_size)):
        names.add(own_dir(Path(), r).name)
        source = (r - per_worker) % world_size
        if source != r:
            names.add(replica_dir(Path(), source).name)
    return names


def drop_foreign(root: Path, belong: set[str]) -> list[str]:
    """Delete the copy folders that do not belong to this layout (another world size or ranks per worker: never
    planned from, nor deleted by any save); their names."""
    foreign = [folder for folder in copy_folders(root) if folder.name not in belong]
    for folder in foreign:
        shutil.rmtree(folder, ignore_errors=True)
    return sorted(folder.name for folder in foreign)


def copy_folders(root: Path) -> list[Path]:
    """The copy folders under a memory root; none when it is gone (local ranks sharing it remove it when they
    release it, any of them first)."""
    try:
        return list(root.glob("*-rank-*"))
    except (FileNotFoundError, NotADirectoryError):
        return []


def wipe(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)


# ---- the restore plan (pure) ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileId:
    """A replica file as its holder sees it. Another host, or another pod on the same node (each pod has its own
    /dev/shm), finds no file of the same device and inode at that path, so a reader that does has the very file
    and may read it directly instead of having it sent."""

    path: str
    device: int
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path) -> FileId:
        st = os.stat(path)
        return cls(str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def visible(self) -> bool:
        try:
            return FileId.of(Path(self.path)) == self
        except OSError:
            return False


@dataclass(frozen=True)
class Inventory:
    """What one rank holds: its own steps and its replicas' (src rank -> steps), each step -> (bytes, world size);
    files: (src rank, step) -> the replica's file, for a reader on the same host."""

    rank: int
    own: dict[int, tuple[int, int]] = field(default_factory=dict)
    replicas: dict[int, dict[int, tuple[int, int]]] = field(default_factory=dict)
    files: dict[tuple[int, int], FileId] = field(default_factory=dict)


@dataclass(frozen=True)
class Source:
    holder: int  # the rank whose host holds the copy: the rank itself (own) or its peer (replica)
    nbytes: int
    file: FileId | None = None  # a replica's file as its holder sees it


@dataclass(frozen=True)
class MemoryPlan:
    step: int
    sources: dict[int, Source]  # rank -> where its copy comes from

    def source_of(self, rank: int) -> str:
        return "memory-own" if self.sources[rank].holder == rank else "memory-peer"

    @property
    def kind(self) -> str:
        """memory-peer when any rank's copy comes from a peer: the restore record's `source`."""
        return "memory-peer" if any(s.holder != r for r, s in self.sources.items()) else "memory-own"


def plan_restore(inventories: list[Inventory], world_size: int, newest_disk_step: int | None
                 ) -> MemoryPlan | str:
    """The newest step complete in memory for every rank (its own copy, else a peer's replica), when it is at least
    as new as the newest committed disk checkpoint; otherwise why not, in words (the restore reads disk)."""
    own = {inv.rank: inv.own for inv in inventories}
    steps = {s for inv in inventories for s in inv.own} | {
        s for inv in inventories for held in inv.replicas.values() for s in held}
    if not steps:
        return "no memory copy"
    sizes = {ws for inv in inventories for _, ws in inv.own.values()}
    if sizes and world_size not in sizes:
        return (f"memory copies were taken at world size {', '.join(map(str, sorted(sizes)))}, now {world_size}: "
                "they are not resharded")
    usable = sorted((s for s in steps if newest_disk_step is None or s >= newest_disk_step), reverse=True)
    if not usable:
        return f"the memory copies (newest step {max(steps)}) are older than disk checkpoint step {newest_disk_step}"
    for step in usable:
        sources: dict[int, Source] = {}
        for rank in range(world_size):
            source = _source_for(rank, step, world_size, own, inventories)
            if source is None:
                break
            sources[rank] = source
        else:
            return MemoryPlan(step, sources)
    return f"no step at or after {usable[-1]} is complete in memory for every rank"


def _source_for(rank: int, step: int, world_size: int, own: dict[int, dict[int, tuple[int, int]]],
                inventories: list[Inventory]) -> Source | None:
    mine = own.get(rank, {}).get(step)
    if mine is not None and mine[1] == world_size:
        return Source(rank, mine[0])
    for inv in inventories:
        held = inv.replicas.get(rank, {}).get(step)
        if held is not None and held[1] == world_size:
            return Source(inv.rank, held[0], inv.files.get((rank, step)))
    return None
