"""etcd v3 rendezvous for torch elastic. Importing this package registers the `etcd-v3` handler with torch's
rendezvous handler registry, so `PET_RDZV_BACKEND=etcd-v3` (or `--rdzv-backend etcd-v3`) is all a launch needs.

The torch-free pieces (session, key layout, worker liveness and the operator-side helpers `watch_workers`,
`list_live_workers`, `delete_run`) live in `flywheel.etcd`; they are re-exported here for the trainer's convenience.
"""

from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

from flywheel.etcd.liveness import (
                                    LiveWorker,
                                    WorkerRegistration,
                                    WorkerWatch,
                                    delete_run,
                                    list_live_workers,
                                    watch_workers,
)
from flywheel.etcd.session import EtcdSession, EtcdUnavailableError, parse_endpoints

from .backend import BACKEND_NAME, EtcdV3RendezvousBackend
from .handler import create_etcd_v3_handler
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
