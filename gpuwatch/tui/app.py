"""The gpuwatch TUI app: one poller feeds the visible screen with snapshots from a data source.

The source is passed in (tests give a fixed one, the CLI gives the store reader). Polls never
overlap: the next one is armed only after the last snapshot arrived. Modal screens pause it.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
from typing import Protocol

from textual.app import App, ScreenStackError
from textual.binding import Binding
from textual.message import Message
from textual.timer import Timer

from gpuwatch.tui.screens.base import LiveScreen
from gpuwatch.tui.screens.modals import ConfirmSignal, HelpScreen
from gpuwatch.tui.screens.overview import OverviewScreen
from gpuwatch.tui.screens.runs import RunsScreen
from gpuwatch.tui.snapshot import ProcessRow, Snapshot, View

FLEET_VIEWS = ("fleet", "fleet_jobs")  # fed by the fleet's source (Prometheus), not the store
NO_FLEET = (
    "no Prometheus to read the fleet from: gpuwatch tui --prometheus URL, or prometheus_url in the config"
)
UNMOUNTED_RETRY_S = 0.05  # a snapshot for a screen still being composed: ask again this soon
TERMINAL_CHECK_S = 2.0  # how often to check the terminal is still there (SSH hang-up)
HARD_EXIT_AFTER_S = 3.0  # if a clean exit cannot finish writing to a dead terminal
TERMINAL_THEME = "ansi-dark"  # Textual's theme of the terminal's default colours and ANSI palette


class DataSource(Protocol):
    def fetch(self, view: View) -> Snapshot: ...

    def close(self) -> None: ...


class SnapshotReady(Message):
    def __init__(self, view: View, snapshot: Snapshot) -> None:
        super().__init__()
        self.view, self.snapshot = view, snapshot


def _user_name(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # containers without a passwd entry for us
        return str(uid)


def fleet_screen() -> LiveScreen:
    from gpuwatch.tui.screens.fleet import FleetScreen  # loaded by those who open it

    return FleetScreen()


def alerts_screen() -> LiveScreen:
    from gpuwatch.tui.screens.alerts import AlertsScreen  # loaded by those who open it

    return AlertsScreen()


class GpuwatchApp(App):
    TITLE = "gpuwatch"
    CSS_PATH = "app.tcss"
    ENABLE_COMMAND_PALETTE = False
    MODES = {"overview": OverviewScreen, "runs": RunsScreen, "fleet": fleet_screen, "alerts": alerts_screen}
    DEFAULT_MODE = "overview"
    BINDINGS = [
        Binding("o", "switch_mode('overview')", "Overview"),
        Binding("r", "switch_mode('runs')", "Runs"),
        Binding("a", "switch_mode('alerts')", "Alerts", show=False),  # the top line says (a)
        Binding("F", "switch_mode('fleet')", "Fleet", show=False),
        Binding("C", "capacity", "Capacity", show=False),
        Binding("question_mark", "help", "Help"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        source: DataSource,
        refresh_s: float = 1.0,
        user: str | None = None,
        uid: int | None = None,
        start_mode: str = DEFAULT_MODE,
        fleet: DataSource | None = None,
    ) -> None:
        # Textual reads DEFAULT_MODE while constructing the app: set before, so that only the
        # start screen is ever mounted and fetched (`gpuwatch demo` opens on "runs").
        self.DEFAULT_MODE = start_mode
        super().__init__()
        # The terminal's own colours, as top and nvitop use: they suit a light terminal as well
        # as a dark one, and a changed figure is sent with the short default-colour code
        # (39;49) instead of a 256-colour pair, which was two thirds of the bytes of a GPU figure.
        self.theme = TERMINAL_THEME
        self.source = source
        self.fleet = fleet  # the Fleet screen's source (Prometheus); None: not configured
        self.refresh_s = refresh_s
        self.my_uid = os.getuid() if uid is None else uid
        self.my_user = _user_name(self.my_uid)
        self.user_filter: str | None = user
        self.only_mine = False
        self._polling = False
        self._again = False
        self._timer: Timer | None = None
        # One thread does every fetch: a Textual worker per poll would cost a task, a thread
        # hand-off and its state messages every second.
        self._requests: queue.SimpleQueue[View | None] = queue.SimpleQueue()
        self._poller = threading.Thread(target=self._poll_loop, name="gpuwatch-poll", daemon=True)

    def on_mount(self) -> None:
        if not self.is_headless and not self.is_web:  # textual-serve ends a closed tab's app itself
            # SSH hang-up: SIGHUP, or a terminal that is no longer one. Exit instead of spinning.
            import asyncio

            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.terminal_gone)
            self.set_interval(TERMINAL_CHECK_S, self._check_terminal)

    def on_ready(self) -> None:
        self._poller.start()
        self.poll_now()  # the first screen exists only now

    def on_unmount(self) -> None:
        if self._poller.ident is None:  # never started: nothing reads the sources
            self._close_sources()
            return
        self._requests.put(None)  # the poll thread closes them once a fetch in flight is done:
        self._poller.join(timeout=1.0)  # closing a connection under a query would crash SQLite

    def _close_sources(self) -> None:
        self.source.close()
        if self.fleet is not None:
            self.fleet.close()

    # -- polling ---------------------------------------------------------------------------

    def poll_now(self) -> None:
        """Fetch for the visible screen now, or right after the poll in flight finishes."""
        if self._polling:
            self._again = True
            return
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        screen = self._visible_screen()
        if screen is None:
            return
        if not isinstance(screen, LiveScreen):  # a modal is open: nothing visible to update
            self._timer = self.set_timer(self.refresh_s, self.poll_now)
            return
        self._polling = True
        view = screen.view()
        self._requests.put(view)

    def _visible_screen(self):
        try:
            return self.screen
        except ScreenStackError:  # shutting down: the screens are already gone
            return None

    def _poll_loop(self) -> None:  # the poll thread
        try:
            while (view := self._requests.get()) is not None:
                self._fetch(view)
        finally:
            self._close_sources()

    def _fetch(self, view: View) -> None:  # runs in the poll thread
        fleet_view = view.kind in FLEET_VIEWS
        if fleet_view and self.fleet is None:
            self.post_message(SnapshotReady(view, Snapshot(now_ms=0, problem=NO_FLEET)))
            return
        try:
            snap = (self.fleet if fleet_view else self.source).fetch(view)
        except Exception as e:  # a bad read must not kill the UI; say what happened
            snap = Snapshot(now_ms=0, problem=f"cannot read the store: {e}")
        self.post_message(SnapshotReady(view, snap))

    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        self._polling = False
        if not self.is_running:  # shutting down: the screens' widgets are being removed
            return
        screen = self._visible_screen()
        if screen is None:
            return
        if isinstance(screen, LiveScreen) and screen.view() == message.view:
            if not screen.is_mounted:  # pushed but not yet composed: no widgets to fill yet
                self._timer = self.set_timer(UNMOUNTED_RETRY_S, self.poll_now)
                return
            screen.update_snapshot(message.snapshot)
        elif isinstance(screen, LiveScreen):
            self._again = True  # the user moved on while we fetched: fetch their view now
        if self._again:
            self._again = False
            self.poll_now()
        else:
            self._timer = self.set_timer(self.refresh_s, self.poll_now)

    # -- actions ---------------------------------------------------------------------------

    def action_capacity(self) -> None:
        from gpuwatch.tui.screens.capacity import CapacityScreen

        if not isinstance(self.screen, CapacityScreen):
            self.push_screen(CapacityScreen())

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def may_signal(self, proc: ProcessRow) -> str | None:
        """Why this user may not signal `proc`, or None when they may."""
        if self.my_uid == 0 or proc.uid == self.my_uid:
            return None
        owner = proc.user or f"uid {proc.uid}"
        return (
            f"Not allowed: pid {proc.pid} belongs to {owner}, and you ({self.my_user}) "
            f"can signal only your own processes"
        )

    def signal_process(self, proc: ProcessRow) -> None:
        refusal = self.may_signal(proc)
        if refusal:
            self.notify(refusal, severity="error", timeout=8, markup=False)  # holds user names
            return

        def send(signum: int | None) -> None:
            if signum is None:
                return
            name = signal.Signals(signum).name
            try:
                os.kill(proc.pid, signum)
            except ProcessLookupError:
                self.notify(f"pid {proc.pid} has already exited", severity="warning")
            except PermissionError:
                self.notify(f"Not allowed: the kernel refused {name} to pid {proc.pid}", severity="error")
            else:
                self.notify(f"sent {name} to pid {proc.pid}")
            self.poll_now()

        self.push_screen(ConfirmSignal(proc), send)

    # -- terminal loss ---------------------------------------------------------------------

    def _check_terminal(self) -> None:
        try:
            alive = os.isatty(sys.__stdin__.fileno()) and os.isatty(sys.__stdout__.fileno())
        except (OSError, ValueError, AttributeError):
            alive = False
        if not alive:
            self.terminal_gone()

    def terminal_gone(self) -> None:
        # Restoring a terminal that is gone can block on writes; don't let that keep us alive.
        watchdog = threading.Timer(HARD_EXIT_AFTER_S, os._exit, args=(129,))
        watchdog.daemon = True
        watchdog.start()
        self.exit(return_code=129)
