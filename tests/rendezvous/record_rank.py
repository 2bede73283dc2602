"""A rank that only says who it became (test helper; no torch import, so 24 of them stay cheap): RANK, LOCAL_RANK,
GROUP_RANK, WORLD_SIZE and FLYWHEEL_REPLICA_INDEX go to OUT_DIR/<replica>.<local rank>.json, then it exits 0.

usage: record_rank.py OUT_DIR
"""

import json
import os
import sys

names = ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "FLYWHEEL_REPLICA_INDEX")
seen = {name: os.environ.get(name) for name in names}
path = os.path.join(sys.argv[1], f"{seen['FLYWHEEL_REPLICA_INDEX']}.{seen['LOCAL_RANK']}.json")
with open(path + ".tmp", "w") as out:
    json.dump(seen, out)
os.replace(path + ".tmp", path)
