"""Progress of long operations: reported by the code that does the work, shown by whoever asked.

Creating a topic of 100,000 partitions, repairing every partition of a topic, verifying or
cleaning a large cluster take a minute or more, and the loops that take the time are deep in
the cluster layer. They report through :func:`tracked`; nothing is shown unless a caller
installed an observer with :func:`observed` (the CLI does, to draw a bar on a terminal). A
context variable rather than a parameter on every function on the way, as logging does with
its handlers: reporting is optional and must not change any signature or result.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterable, Iterator, Optional, TypeVar

#: ``observer(label, done, total)``: called with done=0 when a tracked loop starts, then after
#: each item
Observer = Callable[[str, int, int], None]
T = TypeVar("T")

_OBSERVER: ContextVar[Optional[Observer]] = ContextVar("kafkalog_progress", default=None)


@contextmanager
def observed(observer: Optional[Observer]):
    """Report tracked loops run inside this block (in this thread or task) to ``observer``."""
    token = _OBSERVER.set(observer)
    try:
        yield
    finally:
        _OBSERVER.reset(token)


def tracked(label: str, items: Iterable[T], total: Optional[int] = None) -> Iterator[T]:
    """``items``, reporting each one as done once the caller asks for the next (or ends)."""
    observer = _OBSERVER.get()
    if observer is None:
        yield from items
        return
    if total is None:
        items = list(items)
        total = len(items)
    observer(label, 0, total)
    done = 0
    for item in items:
        yield item
        done += 1
        observer(label, done, total)
