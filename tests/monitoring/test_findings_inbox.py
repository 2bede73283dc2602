from flywheel.monitor.findings import FindingsInbox


def test_a_hang_report_wakes_the_runner_and_is_consumed_once_seen() -> None:
    woken: list[bool] = []
    inbox = FindingsInbox(lambda: woken.append(True))
    inbox.report_hang("no step", 2)
    inbox.report_straggler(True, "rank 1 slow", 2)
    seen = inbox.snapshot()
    assert seen.hang is not None and seen.hang.generation == 2 and woken == [True, True]
    inbox.report_hang("no step again", 2)  # newer than what the pass saw: kept
    inbox.consumed(seen)
    assert inbox.snapshot().hang is not None and inbox.snapshot().hang.message == "no step again"  # type: ignore[union-attr]
    inbox.consumed(inbox.snapshot())
    assert inbox.snapshot().hang is None and inbox.snapshot().straggler is not None  # the verdict stays
