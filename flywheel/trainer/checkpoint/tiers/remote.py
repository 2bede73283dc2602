"""The object-store tier: committed local checkpoints uploaded to checkpoint.dir (s3://bucket/prefix, any fsspec URL).

    <url>/step-00000050/__0_0.distcp ...        each rank uploads the files it wrote
    <url>/step-00000050/flywheel-commit.json    rank 0 writes it last, once every rank's upload finished

The local staging directory (checkpoint.localDir) stays in front: a save commits there first, then the writer thread
uploads it (the loop never waits for it; the next save is skipped while an upload is still running, as for any
slow write). A step without its marker in the bucket is torn and never listed, so a half-uploaded step is never
taken as committed. Restore prefers a local copy of the newest committed step that holds every file its commit
lists, and otherwise downloads it into the local directory (files first, the marker last, moved into place in one
rename; a committed copy lacking files, a per-pod directory's, gets the missing ones), where the checksums of the
commit are verified as for any local checkpoint. Retention and bad-marking apply to the bucket as well. A bucket
unreadable at restore is retried, then fails the start: taken for empty, training would start from scratch.

Library: fsspec (s3fs for s3://). Measured against moto's server on this machine with 64 MB objects: upload s3fs
0.52 s, obstore 0.50-0.62 s (the same: the server is the bound); download s3fs 0.45 s, obstore 0.13 s. Uploads are
the path every save takes, in the background; fsspec also reaches every other store (gs://, az://, ...) through one
API, and s3fs takes credentials from botocore's default chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY,
AWS_ENDPOINT_URL(_S3), AWS_REGION, profiles, IRSA's web identity token), the chain DCP's own FsspecWriter uses.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from flywheel.contracts.memory_root import DIR_ID, read_identity, record_identity
from flywheel.spec import storage as object_store
from flywheel.trainer.checkpoint import integrity, store
from flywheel.trainer.checkpoint.failure import RankCause, primary, rank_cause
from flywheel.trainer.checkpoint.rank_gather import gather_causes
from flywheel.trainer.checkpoint.tiers.bucket import RemoteStore, complete, present

log = logging.getLogger("flywheel.checkpoint")


def describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


class RemoteUnreadable(RuntimeError):
    """The bucket could not be read at restore: the start fails (its message names the field and what to check)."""


ATTEMPTS = 3  # a store call at restore, tried this often (botocore retries each once more within)
BACKOFF_S = 1.0  # seconds before the second try, doubled before each next one

T = TypeVar("T")
Candidate = tuple[store.Committed, bool]


def retried(call: Callable[[], T], what: str) -> T:
    """call(), tried ATTEMPTS times with a doubling pause: a store's brief outage (a restarting endpoint, a
    throttled request) must not fail a restart."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return call()
        except Exception as err:  # the last one is raised
            if attempt == ATTEMPTS:
                raise
            log.warning("%s failed (%s); trying again (%d of %d)", what, describe(err), attempt + 1, ATTEMPTS)
            time.sleep(BACKOFF_S * 2 ** (attempt - 1))
    raise AssertionError("unreachable")


def endpoint(remote: RemoteStore) -> str:
    """Where the store's client connects, for an error message."""
    kwargs = getattr(remote.fs, "client_kwargs", None) or {}
    return str(kwargs.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL_S3")
               or os.environ.get("AWS_ENDPOINT_URL") or f"the default endpoint for {object_store.scheme(remote.url)}://")


def newest_first(local: list[store.Committed], remote: list[store.Committed]) -> list[Candidate]:
    """Restore candidates, newest step first, one per step: the local record when rank 0 has the step, else the
    bucket's; the flag says whether the bucket has the step (so a rank without a local copy can fetch it). Pure."""
    in_bucket = {r.step for r in remote}
    by_step = {r.step: r for r in remote} | {r.step: r for r in local}
    return [(by_step[step], step in in_bucket) for step in sorted(by_step, reverse=True)]


class RemoteTier:
    """The ranks' side of the bucket: upload after a local commit (writer thread), fetch before a restore. Every
    method is called on every rank (collectives on `group`, the checkpointer's writer group)."""

    def __init__(self, url: str, local_root: Path, *, rank: int, world_size: int, group: Any, keep: int,
                 events: Any = None, metrics: Any = None) -> None:
        self.store = RemoteStore(url)
        self.url = self.store.url
        self.local_root = local_root
        self.rank, self.world_size, self.group, self.keep = rank, world_size, group, keep
        self.events, self.metrics = events, metrics
        self.failure: str | None = None  # rank 0: the last failed upload, in words

    def claim_staging(self) -> None:
        """Every rank, before any restore or save: the local staging dir holds copies of this bucket prefix only.
        A prefix deleted to start over is new (a new identity, or none): steps staged for the earlier one would be
        resumed as this run's, and the memory tier (which goes by the staging dir's identity) would restore its
        copies. They are deleted; a staging dir of this prefix keeps its steps (an upload that failed)."""
        answer: list[Any] = [None]
        if self.rank == 0:
            try:
                answer[0] = retried(self.store.identity, f"reading the identity of {self.url}")
            except Exception as err:  # noqa: BLE001 - every rank raises below
                answer[0] = (f"spec.checkpoint.dir: could not read {self.url}/{DIR_ID} ({describe(err)}; tried "
                             f"{ATTEMPTS} times). {self._check_hint()}")
        if self.world_size > 1 and self.group is not None:
            import torch.distributed as dist

            dist.broadcast_object_list(answer, src=0, group=self.group)
        if isinstance(answer[0], str):
            raise RemoteUnreadable(answer[0])
        identity, new = answer[0]
        staged = read_identity(self.local_root)
        if staged != identity if staged else new:
            self._drop_staged(identity)  # ranks sharing the dir (one host) may each do so: rmtree tolerates it
        self._all(True)  # every rank read and tidied before any records (ranks of one host share the dir)
        if staged != identity:
            record_identity(self.local_root, identity)
        self._all(True)

    def _drop_staged(self, identity: str) -> None:
        old = [path for _, path in store.step_dirs(self.local_root)]
        for path in old:
            shutil.rmtree(path, ignore_errors=True)
        if old:
            log.warning("deleted %d staged checkpoint(s) under %s: they belong to an earlier use of %s (deleted or "
                        "replaced since; its identity is now %s)", len(old), self.local_root, self.url, identity)

    def _all(self, flag: bool) -> bool:
        """True when true on every rank."""
        if self.world_size == 1 or self.group is None:
            return flag
        import torch
        import torch.distributed as dist

        t = torch.tensor([int(flag)], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return bool(t.item())

    def _gather(self, error: BaseException | None) -> list[RankCause]:
        """Every rank's cause (empty: no rank failed), gathered as a disk save gathers them."""
        return gather_causes(error, self.rank, self.world_size, self.group if self.world_size > 1 else None)

    def upload(self, folder: Path, step: int) -> bool:
        """Every rank uploads the files it wrote; once all did, rank 0 uploads the marker and applies retention
        in the bucket. Failures are reported with the failing rank's own cause; the local copy stays committed."""
        started = time.monotonic()
        error = self._set_aside_bad(step) if self.rank == 0 else None
        causes = self._gather(error)
        if not causes:  # every rank's files then go into a prefix that holds no damaged step
            try:
                self.store.upload(folder, step, integrity.own_files(folder, self.rank))
            except Exception as err:  # noqa: BLE001 - any store error fails this upload, reported below
                error = err
                log.error("upload of checkpoint step %d to %s failed on rank %d: %s", step, self.url, self.rank,
                          describe(err))
            causes = self._gather(error)
        if self.rank != 0 and store.read_commit(folder) is None:
            # A per-pod directory: this rank's shards only, never rank 0's marker, so never restorable here.
            shutil.rmtree(folder, ignore_errors=True)
        if causes or self.rank != 0:
            if self.rank == 0:
                self._report_failure(step, causes)
            return False
        try:
            self.store.write_commit(folder, step)
        except Exception as err:  # noqa: BLE001
            self._report_failure(step, [rank_cause(0, err)])
            return False
        log.info("checkpoint at step %d uploaded to %s (%.2f s)", step, self.store.step_url(step),
                 time.monotonic() - started)
        self._retention(step)
        return True

    def _set_aside_bad(self, step: int) -> BaseException | None:
        """Rank 0, before `step` is uploaded: a damaged copy of that step in the bucket (marked bad by a restore) is
        moved to bad-step-N-<time>, kept for inspection, so the new save is not mixed into it nor hidden by its bad
        marker (a local damaged checkpoint is renamed when it is marked). The error, if the store failed."""
        try:
            if self.store.is_bad(step):
                log.warning("moved the damaged checkpoint %s to %s before saving that step again",
                            self.store.step_url(step), self.store.set_aside(step))
        except Exception as err:  # noqa: BLE001 - the upload is then failed and reported
            return err
        return None

    def _report_failure(self, step: int, causes: list[RankCause]) -> None:
        """Rank 0: the most telling rank's cause (a peer's follow-on error never wins), every rank's in `error`."""
        cause = primary(causes)
        where = f" on rank {cause.rank}" if self.world_size > 1 else ""
        message = (f"upload of checkpoint step {step} to {self.url} failed{where}: {cause.text}; the local copy in "
                   f"{self.local_root} stays committed and the next checkpoint is uploaded as usual")
        log.error("%s", message)
        self.failure = f"upload to {self.url} failed{where}: {cause.text}"
        if self.metrics is not None:
            self.metrics.checkpoint_failures_total.labels(reason=cause.reason.value).inc()
        if self.events is not None:  # reported like a failed save: once per cause, in words
            self.events.emit("checkpoint_failed", step=step, reason=cause.reason.value, message=message,
                             error="; ".join(f"rank {c.rank}: {c.text}" for c in causes), newest_step=step,
                             source="bucket")

    def holds(self, step: int) -> bool:
        """Rank 0: whether the bucket holds `step` committed (a listing: for the final save only)."""
        try:
            return any(record.step == step for record in self.store.committed())
        except Exception as err:  # noqa: BLE001 - an unreadable bucket does not hold it
            self.failure = f"{self.url} cannot be listed: {describe(err)}"
            return False

    def _retention(self, step: int) -> None:
        try:
            for url in self.store.apply_retention(self.keep, step):
                log.info("deleted checkpoint %s from the bucket (keep: %d)", url, self.keep)
        except Exception as err:  # noqa: BLE001 - clean-up is retried after the next upload
            log.warning("checkpoint clean-up under %s failed: %s", self.url, describe(err))

    def survey(self, local: list[store.Committed]) -> tuple[list[tuple[int, str, str]], list[Candidate]]:
        """Rank 0, before a restore: the bucket's damaged steps set aside (RemoteStore.set_aside_damaged), then the
        restore candidates over the local directory and the bucket. An unreadable bucket is retried, then raises
        RemoteUnreadable: taken for empty, it would start training from scratch over the checkpoints it holds."""
        def look() -> tuple[list[tuple[int, str, str]], list[store.Committed]]:
            return self.store.set_aside_damaged(), self.store.committed()

        try:
            damaged, remote = retried(look, f"listing the checkpoints under {self.url}")
        except Exception as err:  # any store error: said, with what to check
            raise RemoteUnreadable(f"spec.checkpoint.dir: could not list the checkpoints under {self.url} "
                                   f"({describe(err)}; tried {ATTEMPTS} times). {self._check_hint()}") from err
        return damaged, newest_first(local, remote)

    def _check_hint(self) -> str:
        return ("Training does not start while the bucket may hold newer checkpoints: check the store's endpoint "
                f"({endpoint(self.store)}) and credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, "
                "the pod's service-account role, or the store's own), then restart the job")

    def ensure_local(self, step: int, in_bucket: bool) -> tuple[str, set[str]]:
        """Every rank: the local folder of `step`, the bucket's files downloaded into it when this rank's copy
        lacks any (complete()); (path, the files this rank's folder held before). ("", ...) when some rank has no
        whole copy and the bucket lacks the step. A download that keeps failing raises on every rank."""
        target = store.step_dir(self.local_root, step)
        held = present(target) if store.read_commit(target) is not None else set()
        self._all(True)  # every rank looked before any downloads into a directory they share
        error: BaseException | None = None
        if not complete(target) and in_bucket:
            try:
                retried(lambda: self._download(step, target), f"downloading checkpoint step {step}")
            except Exception as err:  # noqa: BLE001 - every rank raises below, with the failing rank's cause
                error = err
        causes = self._gather(error)
        if causes:
            cause = primary(causes)
            raise RemoteUnreadable(
                f"spec.checkpoint.dir: could not download checkpoint step {step} from {self.url} into "
                f"{self.local_root} (spec.checkpoint.localDir) on rank {cause.rank}: {cause.text} (tried "
                f"{ATTEMPTS} times). {self._check_hint()}, or free space under {self.local_root}")
        if not self._all(complete(target)):
            log.info("checkpoint step %d is not whole on every rank and not in %s: skipped", step, self.url)
            return "", held
        return str(target), held

    def _download(self, step: int, target: Path) -> None:
        """Ranks sharing the directory download once (a file lock)."""
        import fcntl

        self.local_root.mkdir(parents=True, exist_ok=True)
        with open(self.local_root / ".download.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not complete(target):
                started = time.monotonic()
                self.store.download(step, self.local_root)
                log.info("downloaded checkpoint step %d from %s (%.2f s)", step, self.url,
                         time.monotonic() - started)

    def mark_bad(self, step: int, reason: str) -> None:
        try:
            self.store.mark_bad(step, reason)
            log.error("marked %s bad in the bucket: never restored", self.store.step_url(step))
        except Exception as err:  # noqa: BLE001
            log.warning("could not mark %s bad: %s", self.store.step_url(step), describe(err))
