"""A module the warm-start tests run in a forked rank: MODE says what it does (see tests/local/test_warm.py)."""

import os
import signal
import sys
import time

mode = os.environ.get("MODE", "exit")
print(f"target pid={os.getpid()} rank={os.environ.get('RANK')} cwd={os.getcwd()} argv={sys.argv[1:]}", flush=True)
if mode == "exit":
    sys.exit(int(os.environ.get("CODE", "0")))
elif mode == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
elif mode == "term":
    signal.signal(signal.SIGTERM, lambda *_: (print("got SIGTERM", flush=True), os._exit(6)))
    time.sleep(60)
elif mode == "raise":
    raise RuntimeError("boom")
else:
    time.sleep(60)
