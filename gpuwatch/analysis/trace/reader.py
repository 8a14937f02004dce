"""Stream a torch.profiler/Kineto trace (`.json` or `.json.gz`) into compact per-rank arrays.

The file is never loaded whole: the top-level object is walked key by key and the
`traceEvents` array is decoded one event at a time with the C scanner behind
`json.JSONDecoder.raw_decode`. Only what the breakdowns need is kept, in `array`s (GPU
activity, launches by correlation id, ProfilerStep spans, data loader / synchronise /
optimizer spans and CPU operators), so memory grows with the number of GPU events, not
with the file's size.

Times follow HTA's parser: `ts` rounded up and the end rounded down to whole microseconds,
events without `dur` or with `cat` "Trace" dropped, `python_function` events skipped.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

_CHUNK = 1 << 20
_DECODER = json.JSONDecoder()
_SKIP = {True: re.compile(r"[ \t\r\n,]*"), False: re.compile(r"[ \t\r\n]*")}

DATALOADER_RE = re.compile(r"enumerate\(DataLoader\)|DataLoaderIter.*__next__")
SYNC_NAMES = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "aten::item",
        "aten::_local_scalar_dense",
    }
)
OPTIMIZER_RE = re.compile(r"^Optimizer\.(step|zero_grad)#")
STEP_RE = re.compile(r"ProfilerStep\s*#\s*(\d+)")
MATH_ATTENTION_OP = "aten::_scaled_dot_product_attention_math"


class TraceError(ValueError):
    """A file that is not a readable Kineto trace; the message names the file and what was wrong."""


@dataclass
class Spans:
    """Closed-open CPU intervals [ts, end) in microseconds."""

    ts: array = field(default_factory=lambda: array("d"))
    end: array = field(default_factory=lambda: array("d"))

    def add(self, ts: float, end: float) -> None:
        self.ts.append(ts)
        self.end.append(end)

    def pairs(self) -> list[tuple[float, float]]:
        return list(zip(self.ts, self.end))


@dataclass
class RankTrace:
    file: str
    rank: int | None = None
    names: list[str] = field(default_factory=list)
    # GPU activity (events with a CUDA stream): one entry per kernel, memcpy or memset.
    gpu_ts: array = field(default_factory=lambda: array("d"))
    gpu_end: array = field(default_factory=lambda: array("d"))
    gpu_name: array = field(default_factory=lambda: array("l"))
    gpu_corr: array = field(default_factory=lambda: array("q"))
    # CPU side of each correlation id (the runtime launch): its start time.
    launch_ts: dict[int, float] = field(default_factory=dict)
    # Events named ProfilerStep* that are not GPU activity (HTA's last-step rule uses them all).
    step_marks: list[float] = field(default_factory=list)
    step_names: set = field(default_factory=set)
    steps: list[tuple[int, float, float, int]] = field(default_factory=list)  # (n, ts, end, tid)
    dataloader: Spans = field(default_factory=Spans)
    sync: Spans = field(default_factory=Spans)
    optimizer: Spans = field(default_factory=Spans)
    math_attention: Spans = field(default_factory=Spans)
    # CPU operators: (ts, end, name id, tid) for the CPU-side breakdown.
    op_ts: array = field(default_factory=lambda: array("d"))
    op_end: array = field(default_factory=lambda: array("d"))
    op_name: array = field(default_factory=lambda: array("l"))
    op_tid: array = field(default_factory=lambda: array("q"))

    _ids: dict = field(default_factory=dict, repr=False)
    _roles: dict = field(default_factory=dict, repr=False)  # CPU event name -> role (see _role)

    def name_id(self, name: str) -> int:
        i = self._ids.get(name)
        if i is None:
            i = self._ids[name] = len(self.names)
            self.names.append(name)
        return i


def _open_text(path: Path):
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


class _Stream:
    """A text buffer over a file that decodes one JSON value at a time."""

    def __init__(self, fh):
        self.fh, self.buf, self.pos, self.eof = fh, "", 0, False

    def _more(self) -> bool:
        if self.eof:
            return False
        chunk = self.fh.read(_CHUNK)
        if not chunk:
            self.eof = True
            return False
        self.buf = self.buf[self.pos :] + chunk
        self.pos = 0
        return True

    def skip(self, commas: bool = True) -> str:
        """Skip whitespace (and commas); return the next character ("" at the end of the file)."""
        pattern = _SKIP[commas]
        while True:
            pos = self.pos = pattern.match(self.buf, self.pos).end()
            if pos < len(self.buf):
                return self.buf[pos]
            if not self._more():
                return ""

    def take(self, ch: str) -> None:
        if self.skip(commas=False) != ch:
            raise json.JSONDecodeError(f"expected {ch!r}", self.buf, self.pos)
        self.pos += 1

    def value(self):
        self.skip(commas=False)
        while True:
            try:
                val, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError:
                if self._more():
                    continue
                raise
            if end == len(self.buf) and not self.eof and self._more():
                continue  # a number may go on in the next chunk
            self.pos = end
            return val


def iter_trace(path: str | Path) -> Iterator[tuple[str, object]]:
    """Yield ("meta", (key, value)) for top-level keys and ("event", dict) for each trace event.

    `traceEvents` itself comes as ("meta", ("traceEvents", None)) before its events.
    """
    path = Path(path)
    with _open_text(path) as fh:
        s = _Stream(fh)
        s.take("{")
        while True:
            ch = s.skip()
            if ch == "}":
                return
            if ch != '"':
                raise json.JSONDecodeError("expected a key", s.buf, s.pos)
            key = s.value()
            s.take(":")
            if key != "traceEvents":
                yield "meta", (key, s.value())
                continue
            s.take("[")
            yield "meta", (key, None)
            while True:
                ch = s.skip()
                if ch == "]":
                    s.pos += 1
                    break
                if not ch:
                    raise json.JSONDecodeError("unterminated traceEvents", s.buf, s.pos)
                yield "event", s.value()


def _int(v) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def read_trace(path: str | Path) -> RankTrace:
    """Read one rank's trace file into a RankTrace; TraceError names what was wrong."""
    path = Path(path)
    rt = RankTrace(file=str(path))
    saw_events = False
    try:
        for kind, item in iter_trace(path):
            if kind == "meta":
                key, val = item
                if key == "distributedInfo" and isinstance(val, dict):
                    rt.rank = _int(val.get("rank"))
                saw_events = saw_events or key == "traceEvents"
                continue
            if isinstance(item, dict):
                _add_event(rt, item)
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError, EOFError, gzip.BadGzipFile, OSError) as e:
        raise TraceError(f"{path}: not a JSON trace ({e.__class__.__name__}: {e})") from None
    if not saw_events:
        raise TraceError(f"{path}: no traceEvents array (not a torch.profiler/Kineto trace)")
    return rt


def _add_event(rt: RankTrace, e: dict) -> None:
    dur, cat = e.get("dur"), e.get("cat")
    if dur is None or cat is None or cat == "Trace" or cat == "python_function":
        return
    try:
        raw_ts = float(e["ts"])
        ts, end = math.ceil(raw_ts), math.floor(raw_ts + float(dur))
    except (KeyError, TypeError, ValueError):
        return
    name = str(e.get("name", ""))
    args = e.get("args")
    args = args if isinstance(args, dict) else {}
    stream = _int(args.get("stream", -1))
    corr = _int(args.get("correlation", -1))
    stream = -1 if stream is None else stream
    corr = -1 if corr is None else corr
    if stream != -1:
        rt.gpu_ts.append(ts)
        rt.gpu_end.append(end)
        rt.gpu_name.append(rt.name_id(name))
        rt.gpu_corr.append(corr)
        return
    if corr >= 0:
        rt.launch_ts.setdefault(corr, ts)
    role = rt._roles.get(name)
    if role is None:
        role = rt._roles[name] = _role(name)
    if role == "step":
        rt.step_marks.append(ts)
        rt.step_names.add(name)
        m = STEP_RE.search(name)
        if m and cat != "gpu_user_annotation":
            rt.steps.append((int(m.group(1)), ts, end, _int(e.get("tid")) or 0))
        return
    if role != "op":
        getattr(rt, role).add(ts, end)
    if cat == "cpu_op":
        rt.op_ts.append(ts)
        rt.op_end.append(end)
        rt.op_name.append(rt.name_id(name))
        rt.op_tid.append(_int(e.get("tid")) or 0)


def _role(name: str) -> str:
    """What a CPU event's name makes it: a step, one of RankTrace's span lists, or an operator."""
    if "ProfilerStep" in name:
        return "step"
    if name in SYNC_NAMES:
        return "sync"
    if DATALOADER_RE.search(name):
        return "dataloader"
    if OPTIMIZER_RE.search(name):
        return "optimizer"
    if name == MATH_ATTENTION_OP:
        return "math_attention"
    return "op"
