"""A rank of a promoted spare (test helper): records who it became, then exits 0.

usage: spare_rank.py OUT_FILE
"""

import json
import os
import sys

names = ("RANK", "WORLD_SIZE", "FLYWHEEL_REPLICA_INDEX", "FLYWHEEL_SPARE", "FLYWHEEL_SPARE_ID", "PROMOTED_SETTING")
with open(sys.argv[1], "w") as out:
    json.dump({name: os.environ.get(name) for name in names}, out)
