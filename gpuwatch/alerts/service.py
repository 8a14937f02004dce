"""The subscriptions API, for one caller: `Local` works the private store directly (per-user
mode, and inside the notify service for each connection's SO_PEERCRED uid); `Remote` asks the
notify service over its socket. Both answer plain dicts, never a whole URL."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuwatch.alerts import KINDS
from gpuwatch.alerts import subscriptions as subs
from gpuwatch.alerts.deliver import check_url, max_alert_id, send
from gpuwatch.base import paths
from gpuwatch.base.config import Config
from gpuwatch.store import StoreError, alert_runs, open_ro
from gpuwatch.store import subscriptions as stored_subs

if TYPE_CHECKING:
    import sqlite3

MAX_REQUEST = 64 * 1024
TEST_TITLE = "gpuwatch: test message"


def _owners(db_path: Path, name: str | None = None, run_id: str | None = None) -> set[int]:
    try:
        conn = open_ro(db_path)
    except StoreError:
        return set()
    try:
        return alert_runs.owners(conn, name=name, run_id=run_id)
    finally:
        conn.close()


class Local:
    def __init__(self, store_path: Path, db_path: Path, host: str = ""):
        self.store_path = Path(store_path)
        self.db_path = Path(db_path)
        self.host = host or socket.gethostname()

    def _conn(self) -> sqlite3.Connection:
        return stored_subs.open_store(self.store_path)

    @staticmethod
    def _scope(uid: int) -> int | None:
        return None if uid == 0 else uid  # root sees and removes every subscription

    def add(
        self,
        uid: int,
        url: str,
        on: str | None = None,
        run: str | None = None,
        run_id: str | None = None,
        transient: bool = False,
    ) -> dict[str, Any]:
        check_url(url)
        kinds = subs.parse_kinds(on, KINDS)
        for value, owners in (
            (run, _owners(self.db_path, name=run) if run else set()),
            (run_id, _owners(self.db_path, run_id=run_id) if run_id else set()),
        ):
            if owners and uid not in owners:
                raise subs.SubscriptionError(
                    f"run {value!r} is another user's: you can only subscribe to your own runs"
                )
        conn = self._conn()
        try:
            sub = stored_subs.add(
                conn,
                uid,
                url,
                kinds,
                run_name=run,
                run_id=run_id,
                transient=transient,
                after_alert_id=max_alert_id(self.db_path),
            )
            return subs.public(sub)
        finally:
            conn.close()

    def list_subscriptions(self, uid: int) -> list[dict[str, Any]]:
        conn = self._conn()
        try:
            return [subs.public(s) for s in stored_subs.listing(conn, self._scope(uid))]
        finally:
            conn.close()

    def remove(self, uid: int, sub_id: int) -> dict[str, Any]:
        conn = self._conn()
        try:
            return subs.public(subs.remove(conn, int(sub_id), self._scope(uid)))
        finally:
            conn.close()

    def test(self, uid: int, sub_id: int | None = None) -> list[dict[str, Any]]:
        """Send a test message to one of the caller's subscriptions, or to each of them."""
        conn = self._conn()
        try:
            chosen = (
                [subs.mine(conn, int(sub_id), self._scope(uid))]
                if sub_id is not None
                else stored_subs.listing(conn, uid)
            )
        finally:
            conn.close()
        return [dict(subs.public(s), error=send(s.url, TEST_TITLE, test_body(self.host))) for s in chosen]

    def deliveries(self, uid: int, alert_ids: list[int]) -> dict[str, list[dict[str, Any]]]:
        if len(alert_ids) > 1000:
            raise subs.SubscriptionError("at most 1000 alert ids per request")
        conn = self._conn()
        try:
            found = subs.deliveries_of(conn, [int(a) for a in alert_ids], self._scope(uid))
        finally:
            conn.close()
        return {str(k): v for k, v in found.items()}


def test_body(host: str) -> str:
    return (
        f"This is a test from gpuwatch on {host}: alerts for this subscription will arrive "
        "here. `gpuwatch notify list` shows your subscriptions."
    )


# The requests the notify service answers, and the arguments each may carry.
OPS = {
    "add": {"url", "on", "run", "run_id", "transient"},
    "list": set(),
    "remove": {"sub_id"},
    "test": {"sub_id"},
    "deliveries": {"alert_ids"},
}
_METHODS = {"list": "list_subscriptions"}


def answer(api: Local, uid: int, line: bytes) -> dict[str, Any]:
    """One request line from a client whose uid the socket vouched for -> one reply dict."""
    try:
        request = json.loads(line)
        op = request.pop("op")
        if op not in OPS or not isinstance(request, dict) or set(request) - OPS[op]:
            raise ValueError
    except (ValueError, KeyError, TypeError, AttributeError):
        return {"error": f"not a notify request (ops: {', '.join(OPS)})"}
    try:
        return {"ok": getattr(api, _METHODS.get(op, op))(uid, **request)}
    except (subs.SubscriptionError, ValueError, TypeError, AttributeError) as e:
        return {"error": str(e) if isinstance(e, subs.SubscriptionError) else f"bad {op} request"}


class Remote:
    """The same calls, answered by the notify service (it knows who we are from the socket)."""

    def __init__(self, socket_path: Path, timeout: float = 60.0):
        self.socket_path = Path(socket_path)
        self.timeout = timeout

    def _ask(self, op: str, **args: object) -> Any:  # the service's JSON reply
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(self.timeout)
            try:
                sock.connect(str(self.socket_path))
                sock.sendall(json.dumps({"op": op, **args}).encode() + b"\n")
                data = b""
                while not data.endswith(b"\n"):
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    data += chunk
            except OSError as e:
                raise subs.SubscriptionError(
                    f"the notify service at {self.socket_path} did not answer: {e.strerror or e}"
                ) from None
        try:
            reply = json.loads(data)
        except ValueError:
            raise subs.SubscriptionError(f"the notify service at {self.socket_path} gave no answer") from None
        if "error" in reply:
            raise subs.SubscriptionError(reply["error"])
        return reply["ok"]

    def add(
        self,
        uid: int,
        url: str,
        on: str | None = None,
        run: str | None = None,
        run_id: str | None = None,
        transient: bool = False,
    ) -> dict[str, Any]:
        reply: dict[str, Any] = self._ask("add", url=url, on=on, run=run, run_id=run_id, transient=transient)
        return reply

    def list_subscriptions(self, uid: int) -> list[dict[str, Any]]:
        reply: list[dict[str, Any]] = self._ask("list")
        return reply

    def remove(self, uid: int, sub_id: int) -> dict[str, Any]:
        reply: dict[str, Any] = self._ask("remove", sub_id=sub_id)
        return reply

    def test(self, uid: int, sub_id: int | None = None) -> list[dict[str, Any]]:
        reply: list[dict[str, Any]] = self._ask("test", sub_id=sub_id)
        return reply

    def deliveries(self, uid: int, alert_ids: list[int]) -> dict[str, list[dict[str, Any]]]:
        reply: dict[str, list[dict[str, Any]]] = self._ask("deliveries", alert_ids=alert_ids)
        return reply


def backend(cfg: Config) -> Local | Remote:
    """The notify service when one listens (system install), else the user's private store."""
    if cfg.notify_socket or paths.SYSTEM_NOTIFY_SOCKET.exists():
        return Remote(cfg.notify_socket_path)
    return Local(cfg.notify_db_path, paths.reader_db_path(cfg.db))
