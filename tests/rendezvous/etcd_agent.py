"""One elastic agent (what `flywheel launch` runs in a worker pod) rendezvousing through etcd-v3.

usage: etcd_agent.py ENDPOINT RUN_ID OUT_DIR WORKER_TTL
"""

import os
import sys

from torch.distributed.launcher.api import LaunchConfig, elastic_launch

import flywheel.agent.rendezvous.handler  # noqa: F401  (registers etcd-v3)

endpoint, run_id, out_dir, worker_ttl = sys.argv[1:5]
config = LaunchConfig(
    min_nodes=2,
    max_nodes=2,
    nproc_per_node=1,
    run_id=run_id,
    rdzv_endpoint=endpoint,
    rdzv_backend="etcd-v3",
    rdzv_configs={
        "join_timeout": 90,
        "last_call_timeout": 1,
        "close_timeout": 10,
        "keep_alive_interval": 1,
        "keep_alive_max_attempt": 3,
        "worker_ttl": int(worker_ttl),
    },
    max_restarts=3,
    monitor_interval=0.2,
    local_addr="127.0.0.1",
)
worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "allreduce_worker.py")
elastic_launch(config, entrypoint=sys.executable)(worker, out_dir)
