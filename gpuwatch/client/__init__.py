"""What a workload imports: `gpuwatch.track(...)` and the run it returns.

Importing this package never imports torch; the client looks torch up in sys.modules when
the workload has already imported it. Run and track are loaded on first use: `gpuwatch run`'s
wrapper imports modules of this package (supervise, transport) before its child starts, and
needs none of the run's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuwatch.client.run import Run, track

__all__ = ["Run", "track"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from gpuwatch.client import run

        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
