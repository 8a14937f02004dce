"""The fleet: many hosts' GPUs and runs, read back from the Prometheus that scrapes their daemons.

Prometheus is the distributed engine; this package only asks it a few instant queries per
refresh (`prometheus`), turns the answers into a frozen `Fleet` (`model`), and chooses free GPUs
from the last minutes of samples, locally or fleet-wide (`pick`). It imports neither textual
nor torch.
"""
