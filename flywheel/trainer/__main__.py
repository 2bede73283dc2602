"""`python -m flywheel.trainer`: one rank of the embedded trainer (started per local rank by `flywheel launch`)."""

import os
import sys
import traceback

from flywheel import exitcodes
from flywheel.trainer import termination_log
from flywheel.trainer.train_loop import main

if __name__ == "__main__":
    try:
        code = main()
    except BaseException as err:  # noqa: BLE001 - KeyboardInterrupt and the like; main() maps every Exception itself
        traceback.print_exc()
        termination_log.write_reason(termination_log.exception_reason(err))
        code = exitcodes.CRASH
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit: background threads (checkpoint writers, the metrics server) must not keep a finished or failed
    # rank alive, and interpreter shutdown must not hang on a broken process group.
    os._exit(code)
