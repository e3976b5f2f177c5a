"""A log dir's root taken away and back, as a failed mount looks to a fresh client."""
from __future__ import annotations

from pathlib import Path


class Unmounted:
    """The second root away, an empty mount point in its place, for as long as it is used."""

    def __init__(self, tmp_path: Path):
        self.where, self.moved = tmp_path / "second", tmp_path / "second.moved"

    def __enter__(self):
        self.where.rename(self.moved)
        self.where.mkdir()
        return self

    def __exit__(self, *exc):
        self.where.rmdir()
        self.moved.rename(self.where)
