"""The terminal transport: the pilot thread as the chat would get it, live.

The status message is one rich Live display updated in place as stages pass (with the
items' progress bar); every other message is printed once, in thread order.
"""

from __future__ import annotations

from rich.console import Console
from rich.live import Live

from bot.console.render import to_rich
from bot.messages.model import Message


class ConsoleNotifier:
    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()
        self._live: Live | None = None
        self.messages: list[Message] = []

    def publish(self, message: Message) -> None:
        self.messages.append(message)
        if message.key == "status":
            renderable = to_rich(message)
            if self._live is None:
                self._live = Live(renderable, console=self.console, refresh_per_second=8,
                                  transient=False, auto_refresh=self.console.is_terminal)
                self._live.start()
            else:
                self._live.update(renderable, refresh=True)
            return
        self.close_live()
        self.console.print(to_rich(message))

    def close_live(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
            if not self.console.is_terminal:
                self.console.line()  # off a terminal, Live leaves its last frame unterminated
