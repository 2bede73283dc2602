"""Test rank for drain ahead (torch-free, so agents restart it quickly): it records its start
(OUT/started.<replica>.<pid>); the first time it waits for the operator's checkpoint request in etcd, answers it as
the trainer would (its done key: {id, step 12}) and exits STOPPED; started again (OUT/started.<replica>.* exists),
it exits 0.

usage: drain_rank.py OUT_DIR   (PET_RDZV_ENDPOINT, PET_RDZV_ID, RANK and FLYWHEEL_REPLICA_INDEX from the agent)
"""

import os
import sys
import time
from pathlib import Path

from flywheel.contracts import exitcodes
from flywheel.etcd import requests as etcd_requests
from flywheel.etcd.session import EtcdSession

out, replica = Path(sys.argv[1]), os.environ["FLYWHEEL_REPLICA_INDEX"]
again = any(out.glob(f"started.{replica}.*"))
(out / f"started.{replica}.{os.getpid()}").touch()
if again:
    sys.exit(0)
run_id, rank = os.environ["PET_RDZV_ID"], int(os.environ["RANK"])
with EtcdSession(os.environ["PET_RDZV_ENDPOINT"], retry_seconds=5.0) as session:
    deadline = time.monotonic() + 60
    while (request := session.run(etcd_requests.read_state(session, run_id)).request) is None:
        if time.monotonic() > deadline:
            sys.exit(1)
        time.sleep(0.05)
    session.run(etcd_requests.put_done(session, run_id, etcd_requests.CheckpointDone(rank, request.id, 12)))
sys.exit(exitcodes.STOPPED)
