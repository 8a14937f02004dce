"""Options and error handling shared by the commands."""

from __future__ import annotations

import functools
import sys

import click

from gpuwatch.base import config as config_mod

# The library's failures that are one line for the user, as (module, class). Looked up, not
# imported: importing the store or the client would cost every command (and the start of
# `gpuwatch run`'s program) tens of ms; a module whose error was raised is loaded.
_KNOWN_ERRORS = (
    ("gpuwatch.store.db", "StoreError"),
    ("gpuwatch.client.link", "RequestError"),  # a request the daemon refused or could not take
)


def db_option(f):
    return click.option(
        "--db",
        "db",
        type=click.Path(dir_okay=False),
        help="Database file (default: the system daemon's if one runs, else yours).",
    )(f)


def friendly_errors(f):
    """Turn the library's known failures into one-line click errors."""

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        try:
            return f(*args, **kwargs)
        except config_mod.ConfigError as e:
            raise click.ClickException(str(e)) from None
        except Exception as e:
            for module, name in _KNOWN_ERRORS:
                loaded = sys.modules.get(module)
                if loaded is not None and isinstance(e, getattr(loaded, name)):
                    raise click.ClickException(str(e)) from None
            raise

    return wrapper


def load_config(**flags) -> config_mod.Config:
    try:
        return config_mod.load(flags)
    except config_mod.ConfigError as e:
        raise click.ClickException(str(e)) from None


def reader_db_path(db: str | None) -> str:
    """The database a reader opens: --db, else config/env, else the system daemon's, else the user's."""
    from gpuwatch.base import paths

    return db or str(paths.reader_db_path(load_config().db))


def pick_rule_options(f):
    """--mem, --max-util, --window: what makes a GPU free, as `pick` and `notify when-free` judge it."""
    for option in reversed(
        (
            click.option(
                "--mem", default="1GiB", show_default=True, help="Free memory each GPU must have, e.g. 40G."
            ),
            click.option(
                "--max-util",
                type=click.FloatRange(0, 100),
                default=10.0,
                show_default=True,
                help="Highest mean utilisation (%) over the window.",
            ),
            click.option(
                "--window",
                "window_min",
                type=click.FloatRange(0.1, 1440),
                default=5.0,
                show_default=True,
                help="Minutes of samples to judge by.",
            ),
        )
    ):
        f = option(f)
    return f
