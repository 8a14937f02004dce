"""gpuwatch: GPU monitoring and profiling for long-sequence PyTorch work on shared servers."""

from gpuwatch.base.version import __version__

__all__ = ["__version__", "autolog", "track"]


def track(*args, **kwargs):
    """Start a run; see gpuwatch.client.track. Imported lazily so `import gpuwatch` stays light."""
    from gpuwatch.client import track as _track

    return _track(*args, **kwargs)


def autolog(*args, **kwargs):
    """Record this interpreter's training with no other change (notebooks, programs someone else
    launched): autolog(name=None, idle_timeout=600.0, tensorboard=None); see
    gpuwatch.integrations.autolog."""
    from gpuwatch.integrations.autolog import autolog as _autolog

    _autolog(*args, **kwargs)


def load_ipython_extension(ipython):
    """`%load_ext gpuwatch`: autolog() with its defaults."""
    autolog()


def unload_ipython_extension(ipython):
    """`%unload_ext gpuwatch`: the current run ends and the hooks come off."""
    from gpuwatch.integrations.autolog import stop

    stop()
