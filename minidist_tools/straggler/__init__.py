"""Straggler detection: which rank is consistently slower, by how much, and one timeline of all ranks.

* :class:`StragglerMonitor` warns during training (:class:`StragglerWarning`, on rank 0);
* :func:`straggler_report` tabulates compute / comm / wait per step and per rank from every rank's spans;
* :func:`step_breakdown` is the arithmetic behind both (:mod:`minidist_tools.straggler.breakdown`);
* :func:`clock_offsets` and :func:`align` put every rank's spans on rank 0's clock (Cristian's
  algorithm) for the report and for one merged Perfetto timeline (``timeline.save_chrome_trace``);
* :func:`injected_delay` reads ``MINIDIST_SLOW_RANK=RANK:SECONDS``, the examples' way to make a rank slow.
"""

from minidist_tools.straggler.breakdown import StepTimes, peer_waits, step_breakdown
from minidist_tools.straggler.clock import ClockOffset, align, clock_offsets, cristian_offset
from minidist_tools.straggler.inject import injected_delay
from minidist_tools.straggler.monitor import StragglerMonitor, StragglerWarning
from minidist_tools.straggler.report import RankSummary, straggler_report, summarize
from minidist_tools.straggler.verdict import Straggler, find_stragglers

__all__ = [
    "ClockOffset",
    "RankSummary",
    "StepTimes",
    "Straggler",
    "StragglerMonitor",
    "StragglerWarning",
    "align",
    "clock_offsets",
    "cristian_offset",
    "find_stragglers",
    "injected_delay",
    "peer_waits",
    "step_breakdown",
    "straggler_report",
    "summarize",
]
