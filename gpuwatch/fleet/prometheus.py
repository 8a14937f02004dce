"""A read-only client for Prometheus's HTTP API (`/api/v1/query`), standard library only.

Every failure (unreachable, an HTTP error, a slow answer, an answer that is not Prometheus's
JSON) becomes one PrometheusError whose message is a single line naming the URL: the TUI shows
it as its status line and `gpuwatch pick` exits with it. Queries of one batch run concurrently
and share one deadline, so a refresh costs the slowest query, never more than the timeout.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

DEFAULT_TIMEOUT_S = 3.0


class PrometheusError(Exception):
    """Prometheus could not answer; the message is one line that says why."""


def _reason(e: BaseException) -> str:
    reason = getattr(e, "reason", e)
    if isinstance(reason, (socket.timeout, TimeoutError)):
        return "timed out"
    return getattr(reason, "strerror", None) or str(reason) or type(reason).__name__


class Prometheus:
    def __init__(self, url: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        parts = urllib.parse.urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise PrometheusError(f"Prometheus URL must look like http://HOST:9090, got {url!r}")
        self.url = url.strip().rstrip("/")
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="prometheus")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def query(self, promql: str, at_s: float | None = None) -> list[dict[str, Any]]:
        """One instant query: the result vector, each item {"metric": {...}, "value": [t, "v"]}."""
        return self.query_many([promql], at_s)[0]

    def query_many(self, promqls: list[str], at_s: float | None = None) -> list[list[dict[str, Any]]]:
        """Instant queries evaluated at one time (now, or `at_s`), concurrently, in one deadline."""
        futures = [self._pool.submit(self._get, q, at_s) for q in promqls]
        done, late = wait(futures, timeout=self.timeout_s)
        if late:
            for f in late:
                f.cancel()
            raise PrometheusError(f"Prometheus at {self.url} did not answer within {self.timeout_s:g} s")
        return [f.result() for f in futures]

    def _get(self, promql: str, at_s: float | None) -> list[dict[str, Any]]:
        params = {"query": promql}
        if at_s is not None:
            params["time"] = f"{at_s:.3f}"
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as resp:
                body = resp.read()
        except urllib.error.HTTPError as e:
            detail = _error_field(e.read()) or e.reason
            raise PrometheusError(f"Prometheus at {self.url} answered HTTP {e.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as e:
            if isinstance(getattr(e, "reason", e), (socket.timeout, TimeoutError)):
                raise PrometheusError(
                    f"Prometheus at {self.url} did not answer within {self.timeout_s:g} s"
                ) from None
            raise PrometheusError(f"Prometheus at {self.url} is unreachable: {_reason(e)}") from None
        try:
            answer = json.loads(body)
            if answer.get("status") != "success":
                raise PrometheusError(
                    f"Prometheus at {self.url} refused {promql!r}: "
                    f"{answer.get('error') or answer.get('status')}"
                )
            data = answer["data"]
            if data["resultType"] != "vector":
                raise TypeError(data["resultType"])
            return [
                {"metric": r["metric"], "value": (float(r["value"][0]), float(r["value"][1]))}
                for r in data["result"]
            ]
        except PrometheusError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError, IndexError):
            raise PrometheusError(
                f"Prometheus at {self.url} sent an answer that is not a Prometheus "
                "query result (is that URL Prometheus?)"
            ) from None


def _error_field(body: bytes) -> str | None:
    """Prometheus puts the reason for an error status in the JSON body's "error"."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    return " ".join(str(error).split()) if error else None
