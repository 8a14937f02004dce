"""Runs from code we did not write: framework callbacks (`hf`, `lightning`) and the zero-code
bootstrap that `gpuwatch run` puts on a child's import path (`bootstrap/`, `autohook`).

Each turns a framework's own events into `gpuwatch.client.Run` calls; nothing here imports a
framework until the user's program has.
"""
