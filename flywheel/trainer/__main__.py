"""`python -m flywheel.trainer`: one rank of the embedded trainer (started per local rank by `flywheel launch`)."""

import traceback

from flywheel.contracts import exitcodes, termination_log
from flywheel.trainer.entry import main
from flywheel.trainer.ft.process_exit import exit_rank

if __name__ == "__main__":
    try:
        code = main()
    except BaseException as err:  # noqa: BLE001 - KeyboardInterrupt and the like; main() maps every Exception itself
        traceback.print_exc()
        termination_log.write_reason(termination_log.exception_reason(err))
        code = exitcodes.CRASH
    exit_rank(code)  # never through interpreter shutdown (process_exit's doc says why)
