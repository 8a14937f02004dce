"""The wire format between workloads and the daemon: the one place that says what is valid.

Newline-delimited JSON frames over a Unix stream socket. Every frame is a JSON object with
`"v": 1` and a `"type"`. A client first sends `hello` and gets `welcome` (or an `error` naming
the version problem); then it sends `events` batches and gets, for each, an `ack` listing the
ids that the daemon's writer has COMMITTED. Any reply may carry `ids`: those are durable.

Client -> daemon: hello, events, control_request.
Daemon -> client: welcome, ack, error (with `code`), control (pushed), control_result.

Frames are capped at MAX_FRAME_BYTES. OOM postmortems (traceback, memory summary, largest
blocks with their stacks) are the large ones - a few hundred KiB - so the cap is 4 MiB; a
sender packs batches under it and a single event must fit alone.

Hostile bytes: every frame gets a reply. A frame nested deeper than MAX_FRAME_DEPTH is refused
before it is decoded; types that cannot be hashed or stored (a `kind` that is an object, an
integer past 64 bits, a lone UTF-16 surrogate) and objects nested deeper than MAX_DEPTH are
refused as `invalid` before anything is hashed or handed to the store. ERROR_CODES lists every
code a reply may carry.

Adding an event kind is one entry in EVENT_KINDS (field specs) plus its applier in
gpuwatch.store.events. Identity fields (uid, user, pid) are never believed: they are dropped
with a warning, the daemon takes identity from SO_PEERCRED.
"""

from __future__ import annotations

import json
import re
import reprlib
from dataclasses import dataclass, field
from functools import partial
from itertools import repeat
from operator import is_not, itemgetter
from typing import Any, Callable

VERSION = 1
MAX_FRAME_BYTES = 4 * 1024 * 1024
MAX_EVENTS_PER_BATCH = 1000
MAX_ID_CHARS = 128
MAX_DEPTH = 32  # nesting of an object field (config, stats, payload): deeper is refused
INT64 = (-(2**63), 2**63 - 1)  # what SQLite stores as an integer
MAX_TS_MS = 253_402_300_799_999  # 9999-12-31: times stay far from overflow in arithmetic

# Every error code a reply may carry, and what it means. Framing errors (too_large, truncated,
# timeout) are followed by a clean close; the others leave the connection open.
ERROR_CODES = {
    "invalid": "the frame or an event is malformed; the message names the field",
    "version": "unsupported protocol version",
    "handshake": "a frame came before hello",
    "too_large": "a frame passed the size cap without a newline; the connection is closed",
    "truncated": "the stream ended inside a frame; the connection is closed",
    "timeout": "a frame took too long to arrive; the connection is closed",
    "unknown_run": "an event or request names a run that does not exist",
    "forbidden": "the run belongs to another user",
    "not_connected": "no client of that run is connected",
    "rate_limited": "too many events per second from this user; retry after retry_after_ms",
    "busy": "the daemon's queues are full; retry later",
    "store": "the database cannot be written now (disk full, read-only); retry later",
    "unavailable": "no daemon answered (set by the client itself)",
    "internal": "the daemon failed on this frame (a bug, logged once); do not retry it",
}
# Error codes a client acts on: retryable ones mean "keep it spooled and try later".
RETRYABLE_CODES = frozenset({"rate_limited", "busy", "store", "unavailable"})

RUN_END_STATUSES = ("finished", "failed", "oom", "killed")
IDENTITY_FIELDS = ("uid", "user", "pid")


class ProtocolError(ValueError):
    """A frame or event is not valid; the message is one line naming the field and the problem,
    `code` the ERROR_CODES entry for the reply."""

    def __init__(self, message: str, code: str = "invalid"):
        super().__init__(message)
        self.code = code


# --- field specs -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """What one field may hold: `check(value)` is True when it is acceptable.

    `check_all(values, types)` says the same of a whole column at once (values not None,
    `types` their set of types), with C-level loops: how a clean batch is validated fast."""

    expected: str
    check: Callable[[Any], bool]
    required: bool = False
    check_all: Callable[[list[Any], set[Any]], bool] | None = None

    def column_ok(self, values: list[Any], types: set[Any]) -> bool:
        if self.check_all is not None:
            return self.check_all(values, types)
        return all(map(self.check, values))


_REPR = reprlib.Repr()  # bounded: a 4 MiB string or a deep list is never copied whole
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = 60


def _show(value: Any) -> str:
    text = _REPR.repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _field(name: str) -> str:
    """A field name as it appears in a message: a hostile key is shown short and quoted."""
    return name if name.isidentifier() and len(name) <= 40 else _show(name)


def _depth_within(value: Any, limit: int) -> bool:
    """True if lists/objects inside `value` nest at most `limit` deep (iterative: no recursion)."""
    level = [value]
    for _ in range(limit + 1):
        level = [
            child
            for item in level
            for child in (item.values() if type(item) is dict else item if type(item) is list else ())
            if type(child) in (dict, list)
        ]
        if not level:
            return True
    return False


# Exact type tests: json.loads makes plain int/float/str, and bool (an int subclass) is refused.
# NaN and inf are numbers: a diverging loss is a fact worth storing, not a protocol error.
_NUMBER = (int, float)
_STR, _INT, _DICT, _NUMBERS = {str}, {int}, {dict}, set(_NUMBER)


def text(max_chars: int = 65536, required: bool = False) -> Spec:
    return Spec(
        f"string of at most {max_chars} characters",
        lambda v: type(v) is str and len(v) <= max_chars,
        required,
        lambda vs, types: types == _STR and max(set(map(len, vs))) <= max_chars,
    )


def _lengths_within(values: list[Any], shortest: int, longest: int) -> bool:
    lengths = set(map(len, values))  # ids of a batch come in few lengths: min/max over those
    return shortest <= min(lengths) and max(lengths) <= longest


def ident(required: bool = True) -> Spec:
    return Spec(
        f"non-empty string of at most {MAX_ID_CHARS} characters",
        lambda v: type(v) is str and 0 < len(v) <= MAX_ID_CHARS,
        required,
        lambda vs, types: types == _STR and _lengths_within(vs, 1, MAX_ID_CHARS),
    )


def integer(minimum: int | None = None, required: bool = False, maximum: int = INT64[1]) -> Spec:
    low, high = (INT64[0] if minimum is None else minimum), maximum
    expected = (
        "64-bit integer"
        if minimum is None
        else f"integer >= {minimum}"
        if maximum == INT64[1]
        else f"integer from {minimum} to {maximum}"
    )
    return Spec(
        expected,
        lambda v: type(v) is int and low <= v <= high,
        required,
        lambda vs, types: types == _INT and low <= min(vs) and max(vs) <= high,
    )


def _ints_fit(values: list[float], types: set[Any]) -> bool:
    """The integers among a number column fit SQLite's 64 bits (it binds a Python int as one)."""
    if int not in types:
        return True
    if types == _INT:
        return INT64[0] <= min(values) and max(values) <= INT64[1]
    return all(INT64[0] <= v <= INT64[1] for v in values if type(v) is int)


def _number_fits(v: Any) -> bool:
    return type(v) is float or (type(v) is int and INT64[0] <= v <= INT64[1])


def number(minimum: float | None = None, required: bool = False) -> Spec:
    if minimum is None:
        return Spec(
            "number", _number_fits, required, lambda vs, types: types <= _NUMBERS and _ints_fit(vs, types)
        )
    below = float(minimum).__gt__  # float vs int or float: no NotImplemented; NaN is not below
    return Spec(
        f"number >= {minimum:g}",
        lambda v: _number_fits(v) and not v < minimum,
        required,  # NaN passes
        lambda vs, types: types <= _NUMBERS and _ints_fit(vs, types) and not any(map(below, vs)),
    )


def percent(required: bool = False) -> Spec:
    """A share from 0 to 100; NaN is refused (a share that cannot be computed is sent as null)."""

    def fits(v: Any) -> bool:
        return type(v) in _NUMBER and 0 <= v <= 100  # NaN compares false: refused

    return Spec(
        "number from 0 to 100", fits, required, lambda vs, types: types <= _NUMBERS and all(map(fits, vs))
    )


def obj(required: bool = False) -> Spec:
    return Spec(
        f"JSON object nested at most {MAX_DEPTH} deep",
        lambda v: type(v) is dict and _depth_within(v, MAX_DEPTH),
        required,
        lambda vs, types: types == _DICT and _depth_within(list(vs), MAX_DEPTH + 1),
    )


def list_of_text(required: bool = False) -> Spec:
    return Spec("list of strings", lambda v: type(v) is list and all(type(x) is str for x in v), required)


def list_of_obj(max_items: int = 1000, required: bool = False) -> Spec:
    return Spec(
        f"list of at most {max_items} JSON objects nested at most {MAX_DEPTH} deep",
        lambda v: (
            type(v) is list
            and len(v) <= max_items
            and all(type(x) is dict for x in v)
            and _depth_within(v, MAX_DEPTH)
        ),
        required,
    )


MAX_LOSSES = 16


def _losses_ok(v: object) -> bool:
    return (
        type(v) is dict
        and len(v) <= MAX_LOSSES
        and all(
            type(k) is str and 0 < len(k) <= 128 and type(x) in _NUMBER and _number_fits(x) and x - x == 0
            for k, x in v.items()
        )
    )  # x - x == 0: finite (NaN, inf fail)


def losses(required: bool = False) -> Spec:
    return Spec(
        f"object of at most {MAX_LOSSES} names (1-128 characters) to finite numbers", _losses_ok, required
    )


def one_of(choices: tuple[str, ...], required: bool = False) -> Spec:
    return Spec(
        f"one of {', '.join(choices)}",
        lambda v: v in choices,
        required,
        lambda vs, types: all(map(choices.__contains__, vs)),
    )


COMMON_FIELDS: dict[str, Spec] = {
    "id": ident(),
    "kind": ident(),
    "run_id": ident(),
    "ts_ms": integer(0, required=True, maximum=MAX_TS_MS),
}

# kind -> field specs (beyond COMMON_FIELDS). Field names are the table's column names, except
# object fields, stored as <name>_json, and run_event's event_kind (the envelope owns "kind").
EVENT_KINDS: dict[str, dict[str, Spec]] = {
    "run_start": {
        "name": text(512),
        "job_id": text(256),
        "config": obj(),
        "command": text(),
        "cwd": text(4096),
        "git_commit": text(64),
        "host": text(256),
        "torch_version": text(64),
        "cuda_version": text(64),
        "gpu_uuids": text(4096),
        "rank": integer(0),
        "local_rank": integer(0),
        "world_size": integer(1),
        "slurm_job_id": text(64),
        "parent_run_id": text(MAX_ID_CHARS),
        "flops_per_token": number(0),
    },
    "step": {
        "step": integer(0, required=True),
        "tokens": integer(0),
        "samples": integer(0),
        "seq_len": integer(0),
        "loss": number(),
        "step_time_ms": number(0),
        "tokens_per_s": number(0),
        "mfu": number(0),
        "data_wait_pct": percent(),
        "mem_allocated_bytes": integer(0),
        "mem_reserved_bytes": integer(0),
        "mem_peak_bytes": integer(0),
        "rss_bytes": integer(0),
        # A folded event (steps faster than the transport's budget): it stands for n_steps
        # steps ending at `step`; tokens and samples are sums, loss and step time means.
        "n_steps": integer(1),
        "step_time_min_ms": number(0),
        "step_time_max_ms": number(0),
        "losses": losses(),  # per-optimiser loss (a fold: each one's mean)
        # the zero-code hooks' split of the step, and a closure optimiser's evaluations
        "compute_pct": percent(),
        "eval_pct": percent(),
        "closure_evals": integer(0),
    },
    "generation": {
        "gen_id": integer(0, required=True),
        "prompt_tokens": integer(0),
        "new_tokens": integer(0),
        "ttft_ms": number(0),
        "itl_p50_ms": number(0),
        "itl_p90_ms": number(0),
        "tokens_per_s": number(0),
        "mem_peak_bytes": integer(0),
        "rss_bytes": integer(0),
    },
    "memory_stats": {
        "step": integer(0, required=True),
        "device": integer(0),
        "num_alloc_retries": integer(0),
        "num_ooms": integer(0),
        "inactive_split_bytes": integer(0),
        "stats": obj(),
    },
    "run_end": {
        "status": one_of(RUN_END_STATUSES, required=True),
        "exit_code": integer(),
        "signal": integer(0),
        "error_type": text(256),
        "error_message": text(),
    },
    "run_event": {
        "seq": integer(0, required=True),
        "event_kind": ident(),
        "payload": obj(),
    },
    # oom_kind is the table's `kind` column (the envelope owns "kind"); lists are stored as JSON.
    "oom_postmortem": {
        "oom_kind": one_of(("gpu", "host"), required=True),
        "device": integer(0),
        "requested_bytes": integer(0),
        "total_bytes": integer(0),
        "free_bytes": integer(0),
        "allocated_bytes": integer(0),
        "reserved_bytes": integer(0),
        "rss_bytes": integer(0),
        "available_bytes": integer(0),
        "cgroup_limit_bytes": integer(0),
        "step": integer(0),
        "seq_len": integer(0),
        "batch": integer(0),
        "phase": one_of(("forward", "backward", "optimizer")),
        "error_message": text(),
        "traceback": text(),
        "memory_summary": text(),
        "stats": obj(),
        "largest_blocks": list_of_obj(100),
        "neighbours": list_of_obj(1000),
        "advice": list_of_obj(50),
        "snapshot_path": text(4096),
    },
    # A profiler window -> a `profiles` row; each of `ops` -> a `profile_ops` row (its columns).
    "profile": {
        "trigger": one_of(("scheduled", "on_demand"), required=True),
        "rank": integer(0),
        "first_step": integer(0),
        "steps": integer(0),
        "trace_path": text(4096),
        "trace_bytes": integer(0),
        "ops": list_of_obj(500),
        # the trace analysis of the window: one rank of `gpuwatch trace --format json`, + advice
        "breakdown": obj(),
    },
    # `gpuwatch note RUN TEXT` -> a `run_notes` row; by the run's owner or root.
    "note": {"text": text(4096, required=True)},
}

# Control actions the daemon may push to a run's client: action -> extra field specs.
CONTROL_ACTIONS: dict[str, dict[str, Spec]] = {
    "profile": {"steps": integer(1)},
    "stacks": {},  # answered by the daemon itself (py-spy dump of the run's process), never pushed
}


# --- messages ----------------------------------------------------------------------------------


@dataclass
class Message:
    """A validated client frame. `events` hold only known fields, nulls removed."""

    type: str
    frame: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def encode(frame: dict[str, Any]) -> bytes:
    """One frame as a line; `v` is added. Raises ProtocolError if it would exceed the cap."""
    data = json.dumps({"v": VERSION, **frame}, separators=(",", ":")).encode() + b"\n"
    if len(data) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(data)} bytes exceeds the {MAX_FRAME_BYTES}-byte cap")
    return data


# \\uD800-\\uDFFF escapes: a pair is one character, a lone one cannot be stored as UTF-8.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
MAX_FRAME_DEPTH = MAX_DEPTH + 8  # frame, events, event, a list of objects, ... then an object field
_ESCAPE = re.compile(rb"\\.", re.S)
_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b'[]{}"')))


def _nesting_within(line: bytes, limit: int) -> bool:
    """False if JSON brackets in `line` (outside strings) nest deeper than `limit`; checked
    before decoding, so no input makes the decoder recurse deeply (a thread's C stack and the
    interpreter's recursion limit are shared with everything else the daemon does). Exact for
    well-formed JSON; malformed JSON that passes nests at most 2 x limit and fails to decode."""
    if line.count(b"[") + line.count(b"{") <= limit:
        return True
    if b"\\" in line:
        line = _ESCAPE.sub(b"", line)  # an escaped quote or bracket is string content
    # Brackets and quotes only, then the strings' contents dropped: the structure alone.
    brackets = b"".join(line.translate(None, _NOT_STRUCTURE).split(b'"')[::2])
    for _ in range(limit):  # each pass removes the innermost level
        shorter = brackets.replace(b"[]", b"").replace(b"{}", b"")
        if len(shorter) == len(brackets):
            break
        brackets = shorter
    # A pair still there sat under more than `limit` levels; many openers left never close.
    return (
        b"[]" not in brackets
        and b"{}" not in brackets
        and brackets.count(b"[") + brackets.count(b"{") <= limit
    )


def decode(line: bytes) -> dict[str, Any]:
    """Parse one frame line (without the cap check, done by the reader)."""
    if not _nesting_within(line, MAX_FRAME_DEPTH):
        raise ProtocolError(f"frame nests deeper than {MAX_FRAME_DEPTH} levels")
    try:
        frame = json.loads(line)
    except (UnicodeDecodeError, ValueError) as e:
        raise ProtocolError(f"frame is not JSON: {str(e)[:200]}") from None
    if not isinstance(frame, dict):
        raise ProtocolError(f"frame must be a JSON object, got {type(frame).__name__}")
    if _SURROGATE_ESCAPE.search(line):
        try:
            json.dumps(frame, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise ProtocolError(
                "frame holds a lone UTF-16 surrogate (\\uD800-\\uDFFF): not valid text"
            ) from None
    return frame


def check_version(frame: dict[str, Any]) -> None:
    v = frame.get("v")
    if type(v) is not int or v != VERSION:
        raise ProtocolError(
            f"unsupported protocol version {_show(v)}; this daemon speaks {VERSION}", "version"
        )


_compiled: dict[str, tuple[dict[str, Any], dict[str, Spec], tuple[str, ...]]] = {}


def _kind_specs(kind: str) -> tuple[dict[str, Spec], tuple[str, ...]]:
    """All field specs of a kind and its required names, recomputed if EVENT_KINDS changes."""
    fields = EVENT_KINDS[kind]
    cached = _compiled.get(kind)
    if cached is None or cached[0] is not fields:
        specs = {**COMMON_FIELDS, **fields}
        cached = (fields, specs, tuple(n for n, s in specs.items() if s.required))
        _compiled[kind] = cached
    return cached[1], cached[2]


def validate_event(event: Any, where: str = "event") -> tuple[dict[str, Any], list[str]]:
    """Check one event; return it with unknown and identity fields dropped, and warnings.
    A null field means "not given" (it stays null); the event is copied only if it must be."""
    if type(event) is not dict:
        raise ProtocolError(f"{where}: expected JSON object, got {_show(event)}")
    kind = event.get("kind")
    if type(kind) is not str:  # before the lookup: an object or a list cannot be hashed
        raise ProtocolError(f"{where}.kind: expected one of {', '.join(EVENT_KINDS)}, got {_show(kind)}")
    if kind not in EVENT_KINDS:
        raise ProtocolError(f"{where}.kind: unknown event kind {_show(kind)}")
    specs, required = _kind_specs(kind)
    warnings: list[str] = []
    if not event.keys() <= specs.keys():
        for name in event.keys() - specs.keys():
            why = "identity comes from the socket" if name in IDENTITY_FIELDS else "unknown field"
            warnings.append(f"{where}.{_field(name)}: ignored ({why})")
        event = {k: v for k, v in event.items() if k in specs}
    for name, value in event.items():
        if value is not None and not specs[name].check(value):
            raise ProtocolError(f"{where}.{name}: expected {specs[name].expected}, got {_show(value)}")
    for name in required:
        if event.get(name) is None:
            raise ProtocolError(f"{where}.{name}: required for {kind} events")
    return event, sorted(warnings)


_not_none = partial(is_not, None)
_NONE_TYPE = type(None)


def _batch_is_clean(events: list[Any]) -> bool:
    """True if every event is valid as it stands (no unknown field, nothing to warn about),
    checked a column at a time. False says nothing more: validate_event then finds the exact
    problem, or keeps the batch after all."""
    if set(map(type, events)) != _DICT:
        return False
    kinds: list[Any] = list(map(dict.get, events, repeat("kind")))
    try:
        distinct = set(kinds)
    except TypeError:  # an unhashable kind: the slow path names it
        return False
    if not distinct <= EVENT_KINDS.keys():
        return False
    groups: dict[str, list[dict[str, Any]]] = {kinds[0]: events}
    if len(distinct) > 1:
        groups = {kind: [] for kind in distinct}
        for kind, event in zip(kinds, events):
            groups[kind].append(event)
    for kind, group in groups.items():
        specs, required = _kind_specs(kind)
        names, columns = _columns(group)
        if not (specs.keys() >= set(names) and set(names).issuperset(required)):
            return False
        for name, values in zip(names, columns):
            spec = specs[name]
            types = set(map(type, values))
            if _NONE_TYPE in types:
                if spec.required:
                    return False
                types.discard(_NONE_TYPE)
                if not types:
                    continue
                values = list(filter(_not_none, values))
            if not spec.column_ok(values, types):
                return False
    return True


def _columns(events: list[dict[str, Any]]) -> tuple[tuple[str, ...], Any]:
    """The events' field names and their values a column at a time (None where one lacks it)."""
    names = tuple(events[0])
    if len(names) > 1 and set(map(len, events)) == {len(names)}:
        try:  # as many fields as the first, and the same ones: every event has every field
            return names, zip(*map(itemgetter(*names), events))
        except KeyError:
            pass
    names = tuple(set().union(*events))
    return names, (list(map(dict.get, events, repeat(name))) for name in names)


def validate_events(events: list[Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """Check a frame's events: the clean ones and the warnings; ProtocolError names the first
    bad field of the first bad event (`events[i].field`)."""
    if _batch_is_clean(events):
        return events, []
    clean: list[dict[str, Any]] = []
    warnings: list[str] = []
    for i, event in enumerate(events):
        event, dropped = validate_event(event, f"events[{i}]")
        clean.append(event)
        warnings.extend(dropped)
    return clean, warnings


def _check_fields(frame: dict[str, Any], specs: dict[str, Spec]) -> None:
    for name, spec in specs.items():
        value = frame.get(name)
        if value is None:
            if spec.required:
                raise ProtocolError(f"{frame['type']}.{name}: required")
            continue
        if not spec.check(value):
            raise ProtocolError(f"{frame['type']}.{name}: expected {spec.expected}, got {_show(value)}")


WISH_FIELDS: dict[str, Spec] = {
    "gpus": integer(1, required=True, maximum=4096),
    "min_free_bytes": integer(0, required=True),
    "max_util_pct": percent(required=True),
    "window_min": number(required=True),
}


def validate(frame: dict[str, Any]) -> Message:
    """Validate a decoded client frame; raise ProtocolError with one exact line otherwise."""
    check_version(frame)
    kind = frame.get("type")
    if kind == "hello":
        _check_fields(frame, {"client": text(256)})
        return Message("hello", frame)
    if kind == "events":
        events = frame.get("events")
        if type(events) is not list:
            raise ProtocolError(f"events: expected list of events, got {_show(events)}")
        if len(events) > MAX_EVENTS_PER_BATCH:
            raise ProtocolError(f"events: {len(events)} events in one frame, at most {MAX_EVENTS_PER_BATCH}")
        clean, warnings = validate_events(events)
        return Message("events", frame, clean, warnings)
    if kind == "control_request":
        action = frame.get("action")
        if type(action) is not str or action not in CONTROL_ACTIONS:
            raise ProtocolError(
                f"control_request.action: expected one of {', '.join(CONTROL_ACTIONS)}, got {_show(action)}"
            )
        _check_fields(frame, {"run_id": ident(), **CONTROL_ACTIONS[action]})
        return Message("control_request", frame)
    if kind == "wish":  # `gpuwatch notify when-free`: alert me once when GPUs are free
        _check_fields(frame, WISH_FIELDS)
        if not 0.1 <= frame["window_min"] <= 1440:  # also refuses NaN
            raise ProtocolError(
                f"wish.window_min: expected minutes from 0.1 to 1440, got {_show(frame['window_min'])}"
            )
        return Message("wish", frame)
    raise ProtocolError(f"type: unknown frame type {_show(kind)}")


def error(message: str, code: str, **extra: Any) -> dict[str, Any]:
    assert code in ERROR_CODES, code
    return {"type": "error", "code": code, "error": message, **extra}
