"""`make demo`'s report: a restore a notebook reports is printed per task, with the forecast made
before the crash beside it and how far the measurement was from it."""
from __future__ import annotations

from statekit.demo import NotebookResult, format_report


def test_the_report_puts_the_forecast_beside_the_measured_restore():
    r = NotebookResult("02_crash_and_restore", "x", seconds=12.5, ok_checks=2)
    r.reports.append({"name": "restore", "restore_seconds": 5.0, "records_replayed": 2_520_008,
                      "forecast_seconds": 4.0, "invariant": "OK",
                      "per_task": [{"task": "0_0", "instance": 0, "source": "scratch",
                                    "seconds": 2.5, "records": 1_260_004, "records/s": 504_001.6,
                                    "forecast s": 2.0}]})
    text = format_report([r])
    assert ("02_crash_and_restore: restore from scratch after a disk loss: 5.0 s of restore work, "
            "2,520,008 changelog records replayed (forecast before the crash: 4.0 s, measured "
            "1.25x the forecast)") in text
    assert ("task 0_0 (instance 0, from scratch): 2.50 s, 1,260,004 records, 504,002 records/s; "
            "forecast 2.00 s") in text
    assert "1/1 notebooks passed" in text
    r.reports[0].pop("forecast_seconds")
    assert "forecast before the crash" not in format_report([r])
