"""`python -m gpuwatch.analysis.tensorboard_live`: the process that mirrors runs into TensorBoard
event files while they run. `gpuwatch run --tensorboard` and `autolog(tensorboard=...)` start it
(gpuwatch/client/tensorboard.py) at low priority, so the training process writes nothing itself;
it reads the database read-only and ends once its runs have."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuwatch.analysis.tensorboard import Selection, follow
from gpuwatch.base import config, paths
from gpuwatch.store import open_ro


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuwatch.analysis.tensorboard_live")
    parser.add_argument("target", help="a directory (files go to TARGET/gpuwatch/), or 'auto'")
    who = parser.add_mutually_exclusive_group(required=True)
    who.add_argument("--wrapper", help="a `gpuwatch run` wrapper's run id: it and its rank runs")
    who.add_argument("--pid", type=int, help="every run this process starts from --since on")
    parser.add_argument("--since", type=int, default=0, help="ms since the epoch")
    parser.add_argument("--watch-pid", type=int, help="end (after a last pass) when it is gone")
    parser.add_argument("--cwd", default=".", help="where 'auto' looks for the program's logs")
    args = parser.parse_args(argv)
    db = paths.reader_db_path(config.load().db)
    selection = Selection(wrapper_run_id=args.wrapper, pid=args.pid, since_ms=args.since)
    try:
        follow(
            lambda: open_ro(db),
            selection,
            args.target,
            Path(args.cwd).resolve(),
            args.watch_pid,
            say=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
