"""Alerts: rules that turn what gpuwatch sees into alert events (one per incident), and their
delivery through apprise to the subscriptions of the people concerned."""

# Every kind of alert, as the CLI, the database and the JSON name them.
RUN_KINDS = ("run.finished", "run.failed", "run.oom", "run.stalled", "run.recovered", "run.slow", "run.lost")
GPU_KINDS = ("gpu.idle_held", "gpu.lost", "gpu.not_responding", "gpu.xid", "gpu.ecc", "gpu.throttled")
HOST_KINDS = ("disk.low", "gpus.free")
KINDS = RUN_KINDS + GPU_KINDS + HOST_KINDS
