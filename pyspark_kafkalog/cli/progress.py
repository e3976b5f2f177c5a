"""A tiny progress bar for long commands: drawn on stderr only when stderr is a terminal, so
pipes, logs and scripts never see it. :class:`Bars` draws the loops the library reports
(``pyspark_kafkalog.progress``); ``main`` installs it for every command but ``--json`` ones."""
from __future__ import annotations

import sys
import time
from typing import Optional

MIN_TOTAL = 50          # fewer steps than this finish too fast to need a bar
REDRAW_S = 0.1


class Progress:
    def __init__(self, total: int, label: str = "", *, stream=None, min_total: int = MIN_TOTAL,
                 width: int = 30, enabled=None):
        self.total = max(int(total), 0)
        self.label = label
        self.stream = sys.stderr if stream is None else stream
        self.width = width
        self.done = 0
        self._last = 0.0
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            try:
                enabled = bool(isatty and isatty()) and self.total >= min_total
            except (OSError, ValueError):
                enabled = False
        self.enabled = enabled
        self._drawn = False

    def __enter__(self) -> "Progress":
        self._draw(force=True)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def advance(self, n: int = 1) -> None:
        self.update(self.done + n)

    def update(self, done: int) -> None:
        self.done = min(done, self.total)
        self._draw(force=self.done == self.total)

    def _draw(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < REDRAW_S:
            return
        self._last = now
        frac = self.done / self.total if self.total else 1.0
        filled = int(frac * self.width)
        bar = "#" * filled + "." * (self.width - filled)
        prefix = f"{self.label} " if self.label else ""
        self.stream.write(f"\r{prefix}[{bar}] {self.done}/{self.total} {frac:4.0%}")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """Erase the bar so that what follows on the terminal starts on a clean line."""
        if self.enabled and self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._drawn = False


class Bars:
    """An observer for ``pyspark_kafkalog.progress.observed``: one :class:`Progress` per
    reported loop, the previous one erased when the next starts."""

    def __init__(self, stream=None):
        self.stream = stream
        self.bar: Optional[Progress] = None
        self.label: Optional[str] = None

    def __call__(self, label: str, done: int, total: int) -> None:
        if self.bar is None or label != self.label or done == 0:
            self.close()
            self.bar, self.label = Progress(total, label, stream=self.stream), label
            self.bar._draw(force=True)
        self.bar.update(done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> "Bars":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
