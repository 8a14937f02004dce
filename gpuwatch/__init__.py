"""gpuwatch: GPU monitoring and profiling for long-sequence PyTorch work on shared servers."""

__version__ = "0.1.0"


def track(*args, **kwargs):
    """Start a run; see gpuwatch.client.track. Imported lazily so `import gpuwatch` stays light."""
    from gpuwatch.client import track as _track

    return _track(*args, **kwargs)
