"""Which run ends the alert rules turn into alerts: this host's runs, once each, never a
`gpuwatch run` wrapper's ranks (their wrapper's end is the alert), including runs that ended
while no rules ran and runs that started and ended between two passes."""

from gpuwatch.alerts.run_rules import RunEnds
from gpuwatch.store import insert_rows, open_rw

NOW = 50_000_000


def run(run_id, status="running", host="h1", parent=None, started=NOW - 600_000, ended=None):
    return dict(
        run_id=run_id,
        uid=1000,
        user="ann",
        host=host,
        status=status,
        parent_run_id=parent,
        started_ms=started,
        ended_ms=ended,
    )


def end(conn, run_id, at):
    conn.execute("UPDATE runs SET status = 'finished', ended_ms = ? WHERE run_id = ?", (at, run_id))


def test_run_ends_are_this_hosts_runs_once_each_never_a_wrappers_ranks(tmp_path):
    conn = open_rw(tmp_path / "g.db")
    insert_rows(
        conn,
        "runs",
        [
            run("before", "finished", ended=NOW - 3_600_000),  # ended while no rules ran
            run("long-ago", "finished", started=NOW - 9 * 3_600_000, ended=NOW - 7 * 3_600_000),
            run("wrapper"),
            run("rank0", parent="wrapper"),
            run("elsewhere", host="h2"),
            run("hostless", host=None),
        ],
    )
    ends = RunEnds("h1")
    assert ends.ended(conn, NOW) == ["before"]  # looks back 6 h, once
    for run_id in ("rank0", "wrapper", "elsewhere", "hostless"):
        end(conn, run_id, NOW + 1000)
    insert_rows(conn, "runs", [run("quick", "finished", started=NOW + 500, ended=NOW + 1500)])
    assert ends.ended(conn, NOW + 2000) == ["hostless", "quick", "wrapper"]
    assert ends.ended(conn, NOW + 4000) == []


def test_a_new_pass_looks_back_only_at_ends_not_alerted_yet(tmp_path):
    """Each `gpuwatch run` with no daemon starts the rules afresh: the runs of the last hours
    whose end already has its alert are not built again (a sweep of short runs would make each
    start pay for all of them)."""
    from gpuwatch.alerts.run_rules import ended_alert
    from gpuwatch.store import alerts as stored

    conn = open_rw(tmp_path / "g.db")
    insert_rows(
        conn,
        "runs",
        [run(f"r{i}", "finished", ended=NOW - 60_000 * (i + 1)) for i in range(3)],
    )
    first = RunEnds("h1").ended(conn, NOW)
    assert first == ["r0", "r1", "r2"]
    for run_id in first[:2]:
        stored.record(conn, ended_alert(conn, run_id))
    assert RunEnds("h1").ended(conn, NOW) == ["r2"]
