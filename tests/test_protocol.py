"""The wire format: what is valid, and the exact one-line errors for what is not."""

from __future__ import annotations

import json

import pytest

from gpuwatch import protocol
from gpuwatch.protocol import ProtocolError, validate


def frame(*events, **extra):
    return {"v": 1, "type": "events", "events": list(events), **extra}


def step(i=0, **fields):
    return {"id": f"e{i}", "kind": "step", "run_id": "r1", "ts_ms": 1000 + i, "step": i, **fields}


def test_valid_batch_keeps_known_fields():
    msg = validate(frame(step(0, tokens=4096, loss=2.5), step(1, tokens=4096, loss=None)))
    assert msg.type == "events"
    assert msg.events[0]["tokens"] == 4096 and msg.events[0]["loss"] == 2.5
    assert msg.events[1]["loss"] is None  # null means "not given"


def test_bad_field_names_index_field_and_value():
    bad = frame(step(0), step(1), step(2), step(3, tokens="abc"))
    with pytest.raises(ProtocolError) as e:
        validate(bad)
    assert str(e.value) == "events[3].tokens: expected integer >= 0, got 'abc'"


@pytest.mark.parametrize(
    "event, message",
    [
        (
            {"id": "a", "kind": "teleport", "run_id": "r", "ts_ms": 1},
            "events[0].kind: unknown event kind 'teleport'",
        ),
        ({"id": "a", "kind": "step", "run_id": "r", "ts_ms": 1}, "events[0].step: required for step events"),
        (
            {"id": "", "kind": "step", "run_id": "r", "ts_ms": 1, "step": 0},
            "events[0].id: expected non-empty string of at most 128 characters, got ''",
        ),
        (
            {"id": "a", "kind": "run_end", "run_id": "r", "ts_ms": 1, "status": "exploded"},
            "events[0].status: expected one of finished, failed, oom, killed, got 'exploded'",
        ),
        (
            {"id": "a", "kind": "step", "run_id": "r", "ts_ms": -5, "step": 0},
            "events[0].ts_ms: expected integer from 0 to 253402300799999, got -5",
        ),
        (
            {"id": "a", "kind": "step", "run_id": "r", "ts_ms": 1, "step": True},
            "events[0].step: expected integer >= 0, got True",
        ),
        (
            {"id": "a", "kind": "run_start", "run_id": "r", "ts_ms": 1, "config": [1, 2]},
            "events[0].config: expected JSON object nested at most 32 deep, got [1, 2]",
        ),
        ("step", "events[0]: expected JSON object, got 'step'"),
    ],
)
def test_each_kind_of_bad_event_has_its_line(event, message):
    with pytest.raises(ProtocolError) as e:
        validate(frame(event))
    assert str(e.value) == message


def test_identity_fields_are_dropped_with_a_warning():
    msg = validate(
        frame(
            {
                "id": "a",
                "kind": "run_start",
                "run_id": "r",
                "ts_ms": 1,
                "uid": 0,
                "user": "root",
                "pid": 1,
                "colour": "blue",
            }
        )
    )
    assert set(msg.events[0]) == {"id", "kind", "run_id", "ts_ms"}
    assert msg.warnings == [
        "events[0].colour: ignored (unknown field)",
        "events[0].pid: ignored (identity comes from the socket)",
        "events[0].uid: ignored (identity comes from the socket)",
        "events[0].user: ignored (identity comes from the socket)",
    ]


def test_nan_loss_is_a_fact_not_an_error():
    decoded = protocol.decode(json.dumps(frame(step(0, loss=float("nan")))).encode())
    assert validate(decoded).events[0]["loss"] != validate(decoded).events[0]["loss"]


def test_wrong_version_and_unknown_type():
    with pytest.raises(ProtocolError, match=r"^unsupported protocol version 7; this daemon speaks 1$"):
        validate({"v": 7, "type": "hello"})
    with pytest.raises(ProtocolError, match=r"^unsupported protocol version None"):
        validate({"type": "hello"})
    with pytest.raises(ProtocolError, match=r"^type: unknown frame type 'dance'$"):
        validate({"v": 1, "type": "dance"})


def test_decode_refuses_non_json_and_non_objects():
    with pytest.raises(ProtocolError, match=r"^frame is not JSON"):
        protocol.decode(b"{nope\n")
    with pytest.raises(ProtocolError, match=r"^frame must be a JSON object, got list$"):
        protocol.decode(b"[1]\n")


def test_batch_size_cap():
    events = [step(i) for i in range(protocol.MAX_EVENTS_PER_BATCH + 1)]
    with pytest.raises(ProtocolError, match=r"^events: 1001 events in one frame, at most 1000$"):
        validate(frame(*events))


def test_encode_refuses_frames_over_the_cap():
    big = {"type": "events", "events": [step(0, note="x" * protocol.MAX_FRAME_BYTES)]}
    with pytest.raises(ProtocolError, match="exceeds the"):
        protocol.encode(big)
    assert protocol.encode({"type": "hello"}).endswith(b"\n")


def test_control_request_actions():
    ok = validate({"v": 1, "type": "control_request", "run_id": "r", "action": "profile", "steps": 5})
    assert ok.type == "control_request"
    with pytest.raises(ProtocolError) as e:
        validate({"v": 1, "type": "control_request", "run_id": "r", "action": "reboot"})
    actions = ", ".join(protocol.CONTROL_ACTIONS)
    assert str(e.value) == f"control_request.action: expected one of {actions}, got 'reboot'"
    with pytest.raises(ProtocolError, match=r"^control_request.steps: expected integer >= 1, got 0$"):
        validate({"v": 1, "type": "control_request", "run_id": "r", "action": "profile", "steps": 0})


def test_adding_a_kind_is_one_table_entry(monkeypatch):
    monkeypatch.setitem(protocol.EVENT_KINDS, "stack_dump", {"reason": protocol.text(64, required=True)})
    msg = validate(frame({"id": "a", "kind": "stack_dump", "run_id": "r", "ts_ms": 1, "reason": "stall"}))
    assert msg.events[0]["reason"] == "stall"


def run_start(i=0, **fields):
    return {"id": f"s{i}", "kind": "run_start", "run_id": "r1", "ts_ms": 1000 + i, **fields}


ODD_VALUES = [
    True,
    -1,
    0,
    1.5,
    -0.5,
    float("nan"),
    float("inf"),
    10**30,
    "",
    "x" * 200,
    "ok",
    None,
    {},
    {"a": 1},
    [],
    ["a"],
    "finished",
]


@pytest.mark.parametrize(
    "field",
    [
        "id",
        "run_id",
        "ts_ms",
        "step",
        "tokens",
        "loss",
        "step_time_ms",
        "mem_peak_bytes",
        "name",
        "config",
        "world_size",
        "status",
    ],
)
def test_a_large_batch_judges_each_value_as_a_lone_event_would(field):
    """A clean batch is checked column-wise; whatever it decides must match event-by-event
    judgement, including the exact line naming the bad event's index."""
    for value in ODD_VALUES:
        odd = (
            step(37, **{field: value})
            if field != "status"
            else {"id": "e37", "kind": "run_end", "run_id": "r1", "ts_ms": 1, "status": value}
        )
        if field in ("name", "config", "world_size"):
            odd = run_start(37, **{field: value})
        events = (
            [run_start()]
            + [step(i, loss=2.5, tokens=8) for i in range(1, 37)]
            + [odd]
            + [step(i, loss=float("nan")) for i in range(38, 60)]
        )
        try:
            expected, _ = protocol.validate_event(odd, "events[37]")
        except ProtocolError as e:
            with pytest.raises(ProtocolError) as got:
                validate(frame(*events))
            assert str(got.value) == str(e), (field, value)
        else:
            assert validate(frame(*events)).events[37] == expected, (field, value)


def test_first_bad_event_is_named_when_several_are_bad():
    events = [step(i) for i in range(1000)]
    events[900]["loss"] = "high"
    events[512]["seq_len"] = -1
    with pytest.raises(ProtocolError) as e:
        validate(frame(*events))
    assert str(e.value) == "events[512].seq_len: expected integer >= 0, got -1"


def test_unknown_field_late_in_a_large_batch_is_warned_and_dropped():
    events = [step(i, tokens=1) for i in range(1000)]
    events[999]["uid"] = 0
    msg = validate(frame(*events))
    assert msg.warnings == ["events[999].uid: ignored (identity comes from the socket)"]
    assert "uid" not in msg.events[999] and len(msg.events) == 1000


def test_events_with_as_many_fields_but_different_ones_are_each_checked():
    events = [step(i, loss=2.5) for i in range(10)] + [step(10, tokens=-1)]
    with pytest.raises(ProtocolError) as e:
        validate(frame(*events))
    assert str(e.value) == "events[10].tokens: expected integer >= 0, got -1"


@pytest.mark.parametrize(
    "line, message",
    [
        (b"[" * 100_000, "frame nests deeper than 40 levels"),
        (
            b'{"v":1,"type":"events","events":[{"id":"a","kind":{"x":1}}]}',
            "events[0].kind: expected one of run_start, step, generation, memory_stats, run_end, run_event, "
            "oom_postmortem, profile, note, got {'x': 1}",
        ),
        (
            b'{"v":1,"type":"events","events":[{"id":"a","kind":[1]}]}',
            "events[0].kind: expected one of run_start, step, generation, memory_stats, run_end, run_event, "
            "oom_postmortem, profile, note, got [1]",
        ),
        (
            b'{"v":1,"type":"control_request","action":{"a":1},"run_id":"r"}',
            "control_request.action: expected one of profile, stacks, got {'a': 1}",
        ),
        (
            b'{"v":1,"type":"events","events":[{"id":"a","kind":"step","run_id":"r","ts_ms":1,"step":9223372036854775808}]}',
            "events[0].step: expected integer >= 0, got 9223372036854775808",
        ),
        (
            b'{"v":1,"type":"events","events":[{"id":"a","kind":"run_start","run_id":"r","ts_ms":1,"config":'
            + b'{"a":' * 34
            + b"1"
            + b"}" * 35
            + b"]}",
            "events[0].config: expected JSON object nested at most 32 deep, got {'a': {'a': {'a': {'a': {'a': {'a': {...",
        ),
        (
            b'{"v":1,"type":"hello","client":"\\ud800"}',
            "frame holds a lone UTF-16 surrogate (\\uD800-\\uDFFF): not valid text",
        ),
        (
            b'{"v":1,"type":"hello","client":"\xff"}',
            "frame is not JSON: 'utf-8' codec can't decode byte 0xff in position 32: invalid start byte",
        ),
    ],
)
def test_hostile_frames_get_one_line_not_an_exception(line, message):
    with pytest.raises(ProtocolError) as e:
        validate(protocol.decode(line))
    assert str(e.value) == message and e.value.code == "invalid"


def test_a_surrogate_pair_is_text_and_an_unknown_field_name_is_shown_short():
    text = "[" * 100 + '\\"[[' + "]" * 50  # brackets and escaped quotes in a string nest nothing
    assert protocol.decode(json.dumps({"v": 1, "type": "hello", "client": text}).encode())["client"] == text
    batch = frame(*[step(i, tokens=4096) for i in range(1000)])  # many brackets, all shallow
    assert len(protocol.decode(json.dumps(batch).encode())["events"]) == 1000
    assert protocol.decode(b'{"v":1,"type":"hello","client":"\\ud83d\\ude00"}')["client"] == "\U0001f600"
    msg = validate(frame(step(0, **{"x" * 10_000: 1})))
    [warning] = msg.warnings
    assert warning.startswith("events[0].'xxx") and warning.endswith("...: ignored (unknown field)")
    assert len(warning) < 80


def test_a_number_field_takes_any_float_but_only_64_bit_integers():
    for fields in ({"step_time_ms": 1e300}, {"loss": float("nan")}, {"mfu": 2**63 - 1}):
        assert validate(frame(step(0, **fields))).events[0] == step(0, **fields)
    for fields in ({"step_time_ms": 2**63}, {"mfu": 5693428374265834504192}, {"loss": -(2**64)}):
        with pytest.raises(ProtocolError, match=r"expected number"):
            validate(frame(step(0, **fields), step(1, loss=0.5)))
