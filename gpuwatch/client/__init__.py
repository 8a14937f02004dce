"""What a workload imports: `gpuwatch.track(...)` and the run it returns.

Importing this package never imports torch; the client looks torch up in sys.modules when
the workload has already imported it.
"""

from gpuwatch.client.run import Run, track

__all__ = ["Run", "track"]
