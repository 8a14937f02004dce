from gpuwatch.store import insert_rows, open_rw
from gpuwatch.store.running import running_runs


def test_running_runs_lists_only_running_runs_of_the_host(tmp_path):
    conn = open_rw(tmp_path / "g.db")
    base = dict(uid=1000, user="ann", started_ms=1, pid=11)
    insert_rows(
        conn,
        "runs",
        [
            dict(base, run_id="a", status="running", host="h1"),
            dict(base, run_id="b", status="finished", host="h1"),
            dict(base, run_id="c", status="running", host="h2"),
            dict(base, run_id="d", status="running", host=None),
        ],
    )
    assert sorted(r.run_id for r in running_runs(conn)) == ["a", "c", "d"]
    assert sorted(r.run_id for r in running_runs(conn, host="h1")) == ["a", "d"]
    assert running_runs(conn, host="h1")[0].user == "ann"
