"""Torch-free etcd v3 pieces shared by the trainer's rendezvous and the operator (bottom layer: imports nothing
from flywheel but itself).

- `keys`: the key layout (`/flywheel/rdzv/<run_id>/...`, `/flywheel/workers/<run_id>/<replica>`, spares, promotions).
- `session`: `EtcdSession`, a synchronous face on the asyncio client `aetcd` (one loop thread, leases kept alive,
  retries and endpoint failover).
- `liveness`: worker liveness keys (`WorkerRegistration`) and the operator's API: `watch_workers`,
  `list_live_workers`, `delete_run`.
- `spares`: warm spares (`SpareRegistration`, the operator's `watch_spares` and `promote`, the agent's
  `wait_for_promotion`).
- `progress`: the progress record global rank 0 keeps under `/flywheel/progress/<run_id>/` and its codec;
  `progress_watch`: the operator's follower of it.
- `requests`: drain ahead's checkpoint request and the ranks' answers; `rank_restart`: the operator's request that
  every agent restart its ranks in place (a hang), and the agent's follower of it.

See docs/etcd-rendezvous.md for the design and the reasons for `aetcd`.
"""

from flywheel.etcd.liveness import (
                                    LiveWorker,
                                    WorkerRegistration,
                                    WorkerWatch,
                                    delete_run,
                                    list_live_workers,
                                    watch_workers,
)
from flywheel.etcd.session import EtcdSession, EtcdUnavailableError, parse_endpoints

__all__ = ["EtcdSession", "EtcdUnavailableError", "LiveWorker", "WorkerRegistration", "WorkerWatch", "delete_run",
           "list_live_workers", "parse_endpoints", "watch_workers"]
