"""Trace analysis: torch.profiler/Kineto traces into where the step went, with advice.

`reader` streams a trace file into compact arrays; `window` picks the events HTA would analyse;
`gpu` and `cpu` hold one pure function per breakdown; `advice` turns the numbers into lines;
`render` writes the table `gpuwatch trace` prints. No pandas: HTA is only the tests' anchor.
"""

from gpuwatch.analysis.trace.analyse import analyse_files, analyse_rank
from gpuwatch.analysis.trace.reader import TraceError, read_trace

__all__ = ["analyse_files", "analyse_rank", "read_trace", "TraceError"]
