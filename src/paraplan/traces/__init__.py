"""Decode real profiler traces (Kineto / Chrome-trace JSON) into iterations and components.

`summarize(paths)` reads one trace per rank and returns a `TraceSummary`; `decode_trace(path)`
reads one. Nothing here imports torch at import time: only `tinyrun`'s workers do.
"""

from paraplan.traces.decode import Collective, Iteration, RankTrace, decode_trace
from paraplan.traces.reader import TraceFileError
from paraplan.traces.summary import TraceSummary, summarize

__all__ = ["Collective", "Iteration", "RankTrace", "TraceFileError", "TraceSummary", "decode_trace", "summarize"]
