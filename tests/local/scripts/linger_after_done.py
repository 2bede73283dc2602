"""Test rank: rank 0 reports training done (as the trainer does once its final checkpoint is committed) and exits
0; every other rank then hangs in its "teardown" until it is stopped."""

import os
import time

from flywheel.eventlog import EventLog

if int(os.environ["RANK"]) == 0:
    time.sleep(0.5)
    EventLog(os.environ["FLYWHEEL_EVENTS_FILE"]).emit("done", step=3)
else:
    time.sleep(600)
