"""The terminal transport: the pilot thread as the chat would get it, live.

The status message is drawn on a timer, never per event: ``publish`` only keeps the latest
state (cheap, whatever the rate of events), and a timer thread draws it. On a terminal,
one rich Live display is redrawn when the state changed (at most every ``tick_s``) and once
a second for the running stage's clock. Off a terminal (a log, a pipe, CI), plain lines: one
per stage that ends, with its elapsed time, and every ``plain_every_s`` one line for the
running stage (its time so far; the pilot's done/total, items per second and ETA), so a
long stage is never silent. On a terminal every other message is printed as it comes, and
the status as it ended before it. Off a terminal every other message gives one plain line
(its summary, when it changed) as it comes, and the panels are printed once, at the end
(``close_live``), each message as it ended, in thread order: a log held every redrawn
panel (1,009 lines for one run) beside the plain lines.
"""

from __future__ import annotations

import threading
import time

from rich.console import Console
from rich.live import Live

from bot.console.render import stage_changes, status_line, to_rich
from bot.messages.model import Message

CLOCK_S = 1.0  # a terminal's unchanged status is redrawn this often (the running clock)


class ConsoleNotifier:
    def __init__(self, console: Console | None = None, *, tick_s: float = 0.25,
                 plain_every_s: float = 2.0, panels_at_end: bool = True) -> None:
        """``panels_at_end``: off a terminal, hold the panels until ``close_live`` (a
        command that follows a run); False prints each as it comes (`preflight watch`,
        which runs for days)."""
        self.console = console or Console()
        self.panels_at_end = panels_at_end
        self.tick_s = tick_s
        self.plain_every_s = plain_every_s
        self.messages: list[Message] = []
        self._live: Live | None = None
        self._status: Message | None = None  # the latest status published
        self._shown: Message | None = None  # the status last drawn (or printed from)
        self._drawn_at = self._plain_at = 0.0
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        # off a terminal: the latest of each message by key, in the order they first came
        # ("status" stands for the status as it ends), and the summary last said of each
        self._held: dict[tuple[str, str], Message | None] = {}
        self._said: dict[tuple[str, str], str] = {}

    def publish(self, message: Message) -> None:
        self.messages.append(message)
        if message.key == "status":
            with self._lock:
                if self._holding():  # by run: a decide follows the volume its pilot launched
                    if self._status is not None and self._status.run_id != message.run_id:
                        self._held[(self._status.run_id, "status")] = self._status
                    self._held.setdefault((message.run_id, "status"), None)
                self._status = message
                if self._timer is None:
                    self._stop.clear()
                    self._timer = threading.Thread(target=self._tick, name="console-status",
                                                   daemon=True)
                    self._timer.start()
            return
        if self._holding():
            with self._lock:
                key = (message.run_id, message.key)
                self._held[key] = message
                said, self._said[key] = self._said.get(key), message.summary
                if message.summary and message.summary != said:
                    self._plain(message.summary)
            return
        self.close_live()
        self.console.print(to_rich(message))

    def close_live(self) -> None:
        """Stop the timer and leave the status as it ended on screen."""
        with self._lock:
            timer, self._timer = self._timer, None
            self._stop.set()
        if timer is not None and timer is not threading.current_thread():
            timer.join()
        with self._lock:
            status = self._status
            if status is not None:
                if self._live is not None:
                    self._live.update(to_rich(status, time.time()), refresh=True)
                    self._live.stop()
                else:
                    for line in stage_changes(self._shown, status):
                        self._plain(line)
                    if (status.run_id, "status") not in self._held:
                        self.console.print(to_rich(status, time.time()))
            held, self._held = self._held, {}
            for (run_id, _key), message in held.items():  # off a terminal: once, at the end
                shown = status if message is None and status is not None \
                    and status.run_id == run_id else message
                if shown is not None:
                    self.console.print(to_rich(shown, time.time()))
            self._live = None
            self._status = self._shown = None

    def _holding(self) -> bool:
        return self.panels_at_end and not self.console.is_terminal

    # -- the timer -------------------------------------------------------------------
    def _tick(self) -> None:
        while not self._stop.wait(self.tick_s):
            with self._lock:
                if self._status is not None and not self._stop.is_set():
                    self._draw(self._status, time.monotonic())

    def _draw(self, status: Message, now: float) -> None:
        if self.console.is_terminal:
            if status is self._shown and now - self._drawn_at < CLOCK_S:
                return
            if self._live is None:
                self._live = Live(console=self.console, auto_refresh=False, transient=False)
                self._live.start()
            self._live.update(to_rich(status, time.time()), refresh=True)
            self._drawn_at = now
        else:
            for line in stage_changes(self._shown, status):
                self._plain(line)
            if now - self._plain_at >= self.plain_every_s:
                running = status_line(status, time.time())
                if running is not None:
                    self._plain(running)
                self._plain_at = now
        self._shown = status

    def _plain(self, line: str) -> None:
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)
