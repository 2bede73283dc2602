"""Worker for the elastic tests: all_reduce in a loop until the test drops a `go` file.

Files in OUT_DIR (argv[1]) steer it and record what happened:
  go            -> finish after at least 3 iterations (the decision is itself all-reduced, so ranks agree)
  crash-rank1   -> global rank 1 exits with 3 during the first attempt (forces a re-rendezvous)
  running.<replica>.<restart>.<rank>.<pid>   written after the first successful all_reduce
  done.<replica>.<restart>.<rank>.json written at the end
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

out_dir = sys.argv[1]
replica = os.environ.get("FLYWHEEL_REPLICA_INDEX", "?")
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
tag = f"{replica}.{restart}.{rank}"

iterations = 0
while True:
    values = torch.tensor([float(rank + 1)])
    dist.all_reduce(values)
    if values.item() != world * (world + 1) / 2:
        sys.exit(f"wrong all_reduce sum {values.item()} for world {world}")
    iterations += 1
    if iterations == 1:
        open(os.path.join(out_dir, f"running.{tag}.{os.getpid()}"), "w").close()
    finish = torch.tensor([1.0 if os.path.exists(os.path.join(out_dir, "go")) else 0.0])
    dist.all_reduce(finish, op=dist.ReduceOp.MAX)
    if finish.item() > 0 and iterations >= 3:
        break
    if rank == 1 and restart == 0 and os.path.exists(os.path.join(out_dir, "crash-rank1")):
        sys.exit(3)
    if iterations > 900:
        sys.exit("no go file after ~90 s")
    time.sleep(0.1)

with open(os.path.join(out_dir, f"done.{tag}.json"), "w") as f:
    json.dump({"replica": replica, "restart": restart, "pid": os.getpid(), "rank": rank, "world": world,
               "iterations": iterations}, f)
dist.destroy_process_group()
