"""etcd v3 rendezvous for torch elastic. Importing this package registers the `etcd-v3` handler with torch's
rendezvous handler registry, so `PET_RDZV_BACKEND=etcd-v3` (or `--rdzv-backend etcd-v3`) is all a launch needs.

Operator-side helpers (`watch_workers`, `list_live_workers`, `delete_run`) live in `liveness`, which does not
import torch; importing them through this package does (the registration below needs torch).
"""

from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

from .backend import BACKEND_NAME, EtcdV3RendezvousBackend
from .etcd_session import EtcdSession, EtcdUnavailableError, parse_endpoints
from .handler import create_etcd_v3_handler
from .liveness import LiveWorker, WorkerRegistration, WorkerWatch, delete_run, list_live_workers, watch_workers
from .store import EtcdStore

rendezvous_handler_registry.register(BACKEND_NAME, create_etcd_v3_handler)

__all__ = [
    "BACKEND_NAME",
    "EtcdSession",
    "EtcdStore",
    "EtcdUnavailableError",
    "EtcdV3RendezvousBackend",
    "LiveWorker",
    "WorkerRegistration",
    "WorkerWatch",
    "create_etcd_v3_handler",
    "delete_run",
    "list_live_workers",
    "parse_endpoints",
    "watch_workers",
]
