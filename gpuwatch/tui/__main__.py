"""`python -m gpuwatch.tui --db PATH`: the TUI alone, as `gpuwatch tui --web` has textual-serve
start it for each browser tab (the command line's options, sampling and checks are not needed
there: the database is named, and the server process checked it)."""

from __future__ import annotations

import argparse
import sys

from gpuwatch.base import config
from gpuwatch.store import StoreError
from gpuwatch.tui import launch


def parser() -> argparse.ArgumentParser:
    """The options gpuwatch.tui.web.tui_command passes."""
    parser = argparse.ArgumentParser(prog="python -m gpuwatch.tui", description=__doc__)
    parser.add_argument("--db", required=True, help="Database file.")
    parser.add_argument("--refresh", type=float, default=1.0, help="Seconds between updates.")
    parser.add_argument("--user", help="Start with processes and runs filtered to this user.")
    parser.add_argument("--prometheus", metavar="URL", help="Open the Fleet screen on this Prometheus.")
    parser.add_argument("--notice", help="A line for the top of the screen.")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        cfg = config.load()
        return launch.run(
            args.db,
            args.refresh,
            args.user,
            start_mode="fleet" if args.prometheus else "overview",
            prometheus_url=args.prometheus or cfg.prometheus_url or None,
            prometheus_timeout=cfg.prometheus_timeout,
            notice=args.notice,
            stale_after_ms=launch.stale_after_ms(cfg, args.refresh),
        )
    except (config.ConfigError, StoreError, launch.LaunchError) as e:
        print(f"gpuwatch tui: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
