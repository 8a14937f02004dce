"""What watches a machine, shared by the daemon and the embedded client: the sampler and its
scheduler and the lost-run watch (which runs are stalled is the alert rules': alerts/stalled_runs.py)."""
