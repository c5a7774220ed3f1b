"""What an acquisition asks for: the name alone, a share of it, or a permit.

An exclusive lease excludes every other lease of its name. Shared leases of a
name coexist with each other and exclude exclusive ones (a readers-writer
lock). A permit is one of ``limit`` leases of a semaphore; semaphores are
named apart from locks, so ``semaphore("x", 3)`` and ``lock("x")`` never
meet.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EXCLUSIVE", "SHARED", "Kind", "limit_mismatch", "permit"]


@dataclass(frozen=True)
class Kind:
    """The kind of an acquisition: ``mode`` and, for permits, the ``limit``."""

    #: "exclusive", "shared" or "permit".
    mode: str
    #: How many permits the semaphore has (None unless ``mode`` is "permit").
    limit: int | None = None

    @property
    def exclusive(self) -> bool:
        """True for an exclusive lock (the only kind that may make fenced writes)."""
        return self.mode == "exclusive"

    def __str__(self) -> str:
        if self.mode == "permit":
            return f"permit of {self.limit}"
        return self.mode


EXCLUSIVE = Kind("exclusive")
SHARED = Kind("shared")


def permit(limit: int) -> Kind:
    """Return the kind of one permit of a semaphore of ``limit`` permits."""
    return Kind("permit", limit)


def limit_mismatch(name: str, theirs: object, mine: int | None) -> ValueError:
    """Return the error of a permit asked for with ``mine`` permits while
    semaphore ``name`` is held with ``theirs``: every backend says the same."""
    return ValueError(
        f"Semaphore {name!r} is held with a limit of {theirs} permits, not "
        f"{mine}: every holder must pass the same limit."
    )
