"""Test rank for the restart in place the operator asks for: the first time, it records its pid
(OUT/started.<RANK>.<pid>) and SIGSTOPs itself (a hang no timer of its own can end); started again (OUT/started.<RANK>.*
exists already), it records its pid and exits 0. TORCHELASTIC_RESTART_COUNT goes to OUT/restart-count.<RANK>."""

import os
import signal
import sys
from pathlib import Path

out, rank = Path(sys.argv[1]), os.environ["RANK"]
again = any(out.glob(f"started.{rank}.*"))
(out / f"started.{rank}.{os.getpid()}").touch()
(out / f"restart-count.{rank}").write_text(os.environ.get("TORCHELASTIC_RESTART_COUNT", "?"))
if not again:
    os.kill(os.getpid(), signal.SIGSTOP)
