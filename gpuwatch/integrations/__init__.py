"""Runs from code we did not write: framework callbacks (`hf`, `lightning`) and the zero-code
bootstrap that `gpuwatch run` puts on a child's import path (`bootstrap/`, `autohook`).

Each turns a framework's own events into `gpuwatch.client.Run` calls; nothing here imports a
framework until the user's program has.
"""

import os

# What `gpuwatch run` links into a Python child's import path; here, not in autohook, so that the
# wrapper finds it without importing the client before it spawns the program.
BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")
# Set to "0" in a child's environment: our hooks stay off (`gpuwatch run --no-instrument`).
ENV_INSTRUMENT = "GPUWATCH_INSTRUMENT"
