"""The bucket's side of the object-store tier (tiers/remote.py): plain calls on one checkpoint.dir URL, no
collectives. A step's folder holds its files and, last, its commit marker; the prefix's root holds its identity
(`flywheel-run-id`), which the local staging dir records."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from pathlib import Path

from flywheel.contracts.memory_root import DIR_ID
from flywheel.spec import storage as object_store
from flywheel.trainer.checkpoint import integrity, store

log = logging.getLogger("flywheel.checkpoint")


class RemoteStore:
    """One checkpoint.dir URL: plain object-store calls, no collectives (RemoteTier coordinates the ranks)."""

    def __init__(self, url: str) -> None:
        from fsspec.core import url_to_fs

        self.url = object_store.normalise(url).rstrip("/")  # S3://b/p: fsspec knows the scheme in lower case
        self.fs, root = url_to_fs(self.url)
        self.root = str(root).rstrip("/")

    def identity(self) -> tuple[str, bool]:
        """The prefix's identity (`flywheel-run-id` at its root), created when it has none: (it, whether the prefix
        is new: no identity and no step; one with steps but no identity was written before identities)."""
        key = f"{self.root}/{DIR_ID}"
        try:
            found = self.fs.cat_file(key).decode().strip()
        except FileNotFoundError:
            found = ""
        if found:
            return found, False
        made = uuid.uuid4().hex
        self.fs.pipe_file(key, (made + "\n").encode())
        return made, not self._steps()

    def _key(self, step: int, name: str = "") -> str:
        folder = f"{self.root}/{store.step_dir('', step).name}"
        return f"{folder}/{name}" if name else folder

    def step_url(self, step: int) -> str:
        return f"{self.url}/{store.step_dir('', step).name}"

    def upload(self, folder: str | os.PathLike[str], step: int, names: list[str]) -> None:
        for name in names:
            self.fs.put_file(str(Path(folder) / name), self._key(step, name))

    def write_commit(self, folder: str | os.PathLike[str], step: int) -> None:
        """The local commit marker, uploaded last: one PUT, so the bucket's copy appears whole or not at all."""
        self.fs.pipe_file(self._key(step, store.COMMIT_MARKER), (Path(folder) / store.COMMIT_MARKER).read_bytes())

    def _steps(self) -> list[tuple[int, str]]:
        self.fs.invalidate_cache()  # listings are cached by fsspec; another writer (a previous run) changed them
        try:
            entries = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        found = []
        for entry in entries:
            match = store.STEP_DIR.match(str(entry).rstrip("/").rsplit("/", 1)[-1])
            if match:
                found.append((int(match.group(1)), str(entry).rstrip("/")))
        return sorted(found)

    def _read_commit(self, step: int) -> store.Committed | None:
        record = self._commit_or_damage(step)
        if isinstance(record, str):
            log.warning("ignoring checkpoint %s: %s", self.step_url(step), record)
            return None
        return record

    def _commit_or_damage(self, step: int) -> store.Committed | str | None:
        """The step's commit record; None when its marker is missing (torn); why, when it is there but unreadable."""
        try:
            return store.parse_commit(self.step_url(step), self.fs.cat_file(self._key(step, store.COMMIT_MARKER)))
        except FileNotFoundError:
            return None
        except ValueError as err:
            return str(err)

    def set_aside_damaged(self) -> list[tuple[int, str, str]]:
        """Mark bad every step whose marker is there but unreadable (damage after its commit: kept, never deleted as
        torn): (step, its URL, why)."""
        damaged = []
        for step, _ in self._steps():
            why = self._commit_or_damage(step)
            if isinstance(why, store.Committed) and why.step != step:
                why = f"its commit marker is for step {why.step}"
            if isinstance(why, str) and not self.is_bad(step):
                self.mark_bad(step, why)
                damaged.append((step, self.step_url(step), why))
        return damaged

    def is_bad(self, step: int) -> bool:
        return bool(self.fs.exists(self._key(step, integrity.BAD_MARKER)))

    def committed(self) -> list[store.Committed]:
        """Committed steps in the bucket not marked bad, oldest first (their `path` is the step's URL)."""
        found = []
        for step, _ in self._steps():
            record = self._read_commit(step)
            if record is not None and record.step == step and not self.is_bad(step):
                found.append(record)
        return found

    def mark_bad(self, step: int, reason: str) -> None:
        """Out of every listing, kept for inspection (an object store has no cheap rename)."""
        self.fs.pipe_file(self._key(step, integrity.BAD_MARKER),
                          json.dumps({"reason": reason, "time": time.time()}).encode())

    def set_aside(self, step: int) -> str:
        """Move the step's objects to bad-step-N-<time> (copies: an object store has no rename); its new URL."""
        name = f"bad-{store.step_dir('', step).name}-{int(time.time())}"
        source = self._key(step)
        for key in self.fs.find(source):  # one object at a time: fsspec's recursive copy also copies the prefix
            self.fs.copy(key, f"{self.root}/{name}/{str(key)[len(source) + 1:]}")
        self.fs.rm(source, recursive=True)
        return f"{self.url}/{name}"

    def delete(self, step: int) -> None:
        """The marker first: a deletion interrupted halfway leaves a torn step, never a committed one with holes."""
        try:
            self.fs.rm_file(self._key(step, store.COMMIT_MARKER))
        except FileNotFoundError:
            pass
        try:
            self.fs.rm(self._key(step), recursive=True)
        except FileNotFoundError:
            pass

    def apply_retention(self, keep: int, newest_step: int) -> list[str]:
        """The oldest committed steps beyond `keep` and torn steps older than `newest_step` are deleted."""
        records = self.committed()
        older = sorted((r.step for r in records if r.step != newest_step), reverse=True)
        kept = {newest_step, *older[: max(keep - 1, 0)]}
        listed = {r.step for r in records}
        deleted = []
        for step, _ in self._steps():
            torn = (step not in listed and step < newest_step and not self.is_bad(step)
                    and self._commit_or_damage(step) is None)  # no marker at all; a damaged one is set aside
            if (step in listed and step not in kept) or torn:
                self.delete(step)
                deleted.append(self.step_url(step))
        return deleted

    def download(self, step: int, root: str | os.PathLike[str]) -> Path:
        """The bucket's step into root/step-N: files into a private folder, the marker last, then one rename (so
        ranks sharing root never see a half-downloaded step). A committed local copy that lacks files (a per-pod
        directory holds its own rank's shards only) keeps its files: the missing ones are added, each renamed into
        place whole. Returns the local folder."""
        target = store.step_dir(root, step)
        if complete(target):
            return target  # another rank sharing this directory was first
        incoming = Path(root) / f".incoming-{target.name}-{os.getpid()}"
        shutil.rmtree(incoming, ignore_errors=True)
        incoming.mkdir(parents=True)
        try:
            names = [str(k).rsplit("/", 1)[-1] for k in self.fs.ls(self._key(step), detail=False)]
            if store.read_commit(target) is not None:
                self._add_missing(step, target, incoming, names)
                return target
            for name in sorted(n for n in names if n not in (store.COMMIT_MARKER, integrity.BAD_MARKER)):
                self.fs.get_file(self._key(step, name), str(incoming / name))
            self.fs.get_file(self._key(step, store.COMMIT_MARKER), str(incoming / store.COMMIT_MARKER))
            if target.exists() and store.read_commit(target) is None:
                shutil.rmtree(target, ignore_errors=True)  # a torn local folder of the same step
            try:
                incoming.rename(target)
            except OSError:
                if store.read_commit(target) is None:
                    raise
        finally:
            shutil.rmtree(incoming, ignore_errors=True)
        return target

    def _add_missing(self, step: int, target: Path, incoming: Path, names: list[str]) -> None:
        """The bucket's files that the committed local folder lacks, each downloaded whole then renamed in."""
        for name in sorted(set(names) - {store.COMMIT_MARKER, integrity.BAD_MARKER} - present(target)):
            self.fs.get_file(self._key(step, name), str(incoming / name))
            (incoming / name).rename(target / name)


def present(folder: Path) -> set[str]:
    """The files in a folder (none when it is missing)."""
    try:
        return {p.name for p in folder.iterdir() if p.is_file()}
    except OSError:
        return set()


def complete(folder: Path) -> bool:
    """Whether a committed folder holds every file its commit lists: with per-pod directories, rank 0's copy has
    the marker and its own shards only, and is usable only once the other ranks' shards are downloaded."""
    record = store.read_commit(folder)
    return record is not None and set(record.checksums) <= present(folder)
