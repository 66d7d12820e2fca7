"""FailureLog: one traceback per kind of failure, repeats summarised with a count."""
import logging

from vla_edge_ros.core.failure_log import FailureLog


def _fail(flog, message):
    try:
        raise RuntimeError(message)
    except RuntimeError as exc:
        flog.report("cycle", exc)


def test_one_traceback_per_kind_then_counts(caplog):
    logger = logging.getLogger("test_failure_log")
    with caplog.at_level(logging.INFO, logger="test_failure_log"):
        every_time = FailureLog(logger, period_s=0.0)         # no throttle: each repeat reports its count
        for _ in range(3):
            _fail(every_time, "device fault")
        _fail(every_time, "another fault")
    records = caplog.records
    assert [bool(r.exc_info) for r in records] == [True, False, False, True]
    assert "1 repeated failures" in records[1].getMessage() and "device fault" in records[1].getMessage()

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="test_failure_log"):
        throttled = FailureLog(logger, period_s=3600.0)
        for _ in range(100):
            _fail(throttled, "device fault")
    assert len(caplog.records) == 1 and caplog.records[0].exc_info
