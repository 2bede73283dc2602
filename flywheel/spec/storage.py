"""checkpoint.dir as an object-store URL (s3://bucket/prefix, gs://..., any fsspec protocol): what it means here.

A URL dir is written through fsspec (s3fs for s3://) with the local staging directory in front of it
(`checkpoint.localDir`, default under /tmp, the pod's emptyDir on a cluster): the trainer commits a save there first
and uploads it in the background (trainer/checkpoint/tiers/remote.py). `flywheel plan/run` refuse a scheme fsspec does
not know, or one whose library is not installed, naming checkpoint.dir. No torch here: spec checks and the CLI
import it.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from flywheel.layout.rules import Problem

# A checkpoint.dir with a scheme (s3://bucket/prefix, gs://...) is an object store every worker reaches, except
# fsspec's names for the local disk (file://, local://: a path). The same patterns are the CRD's CEL rule
# (spec/crd/generate.py), so the cluster's verdict and the operator's are one.
OBJECT_STORE_URL = r"^[a-zA-Z][a-zA-Z0-9+.-]*://"
LOCAL_DISK_URL = r"^(?i:file|local)://"


def names_object_store(directory: str) -> bool:
    """Whether checkpoint.dir names an object store (a URL whose scheme is not the local disk's)."""
    return bool(re.match(OBJECT_STORE_URL, directory)) and not re.match(LOCAL_DISK_URL, directory)


@dataclass(frozen=True)
class CheckpointStorage:
    """What the cluster rule on checkpoint storage reads (the local runner shares one machine's disk: no rule)."""

    replicas_max: int
    claim_name: str
    directory: str
    ephemeral: bool


def cluster_storage_problems(job: CheckpointStorage) -> list[Problem]:
    """On a cluster, more than one worker without a shared claim or an object store writes each worker's shards to
    its own emptyDir: lost with the pod, so no checkpoint could ever be restored. Refused unless ephemeral."""
    if job.replicas_max <= 1 or job.claim_name or job.ephemeral or names_object_store(job.directory):
        return []
    return [Problem("ckpt-shared", "checkpoint.claimName", f"{job.replicas_max} workers (replicas.max) without a "
                    "claim would each write their checkpoint shards to their own emptyDir, lost with the pod",
                    "set checkpoint.claimName to a ReadWriteMany PersistentVolumeClaim mounted in every worker, or "
                    "checkpoint.ephemeral: true to accept losing the checkpoints")]


DEFAULT_LOCAL_ROOT = "/tmp/flywheel-checkpoints"  # /tmp is the pod's emptyDir on a cluster (manifests.py)


def is_url(directory: str) -> bool:
    """Whether checkpoint.dir names an object store (a scheme other than file:// or local://, which name a path)."""
    return names_object_store(directory)


def scheme(directory: str) -> str:
    return directory.split("://", 1)[0].lower()


def normalise(directory: str) -> str:
    """The URL with its scheme in lower case (fsspec knows `s3`, not `S3`); a path unchanged."""
    if not re.match(OBJECT_STORE_URL, directory):
        return directory
    return f"{scheme(directory)}://{directory.split('://', 1)[1]}"


def local_dir(directory: str, configured: str = "") -> str:
    """Where saves are staged (and restores read from) for checkpoint.dir: the dir itself when it is a path (the
    path of a file:// URL); for a URL, checkpoint.localDir, else a folder under /tmp named after the bucket and
    prefix (one URL, one folder)."""
    if not is_url(directory):  # localDir applies to object stores only
        return directory.split("://", 1)[1] if re.match(OBJECT_STORE_URL, directory) else directory
    if configured:
        return configured
    parts = urlsplit(directory)
    name = "/".join(p for p in (parts.netloc + parts.path).split("/") if p not in ("", ".", ".."))
    return f"{DEFAULT_LOCAL_ROOT}/{scheme(directory)}/{name or 'root'}"


def storage_problem(directory: str) -> str | None:
    """Why checkpoint.dir cannot be used on this machine (an unknown scheme, a missing library, no bucket or no
    path after the scheme), or None."""
    if not is_url(directory):
        if re.match(OBJECT_STORE_URL, directory) and not local_dir(directory):
            return f"spec.checkpoint.dir: {directory!r} names no directory; use file:///path or the path itself"
        return None
    proto = scheme(directory)
    if not directory.split("://", 1)[1].split("/", 1)[0]:
        return (f"spec.checkpoint.dir: {directory!r} names no bucket; use {proto}://bucket/prefix (the bucket "
                "first, then the folder the checkpoints go under)")
    try:
        from fsspec.registry import known_implementations, registry
    except ImportError:
        return (f"spec.checkpoint.dir: {directory!r} is an object-store URL but fsspec is not installed; "
                "install flywheel with its object-store libraries (pip install fsspec s3fs) or use a path")
    if proto in registry:
        return None
    known = known_implementations.get(proto)
    if known is None:
        return (f"spec.checkpoint.dir: unknown storage scheme {proto!r} in {directory!r}; use a path, s3://bucket/"
                "prefix, gs://bucket/prefix or another fsspec protocol")
    module = str(known["class"]).rsplit(".", 1)[0]
    try:
        importlib.import_module(module)
    except ImportError:
        hint = known.get("err") or f"install the package that provides {module}"
        return f"spec.checkpoint.dir: {directory!r} needs a library that is not installed: {hint}"
    return None
