"""A second oracle: is a lock's history linearizable against a mutex?

The interval checker (:func:`tests.torture.history.check`) compares critical
sections pairwise. This one asks the question Jepsen's lock checkers ask:
is there one order of the operations, each taking effect at an instant
between its invocation and its completion, that a single mutex would allow
(acquire only when free, release only by the holder)?

Per lock name, every critical section contributes two operations:

- its acquire, invoked at ``inv`` (the attempt's start) and completed at
  ``start`` (just before the section began);
- its release, invoked at ``end`` and completed at ``done``, if the release
  succeeded. A section whose release reported the lease lost (``LockLost``,
  a backend error) has an indeterminate release: the lease ran out at some
  instant after the acquire took effect and before ``done``.

Acquisitions that failed (busy, or an error, i.e. indeterminate) are left
out: a grant that nobody received is, in a mutex history, an acquire followed
by a release at any later instant, which explains nothing and forbids
nothing.

For a mutex this reduces to two conditions, which is what makes the check
fast enough for a million sections (``test_linearizable.py`` compares it with
an exhaustive search over every order of small histories):

- a confirmed section held the lock at least from ``start`` to ``end`` (its
  acquire took effect no later than ``start``, its release no earlier than
  ``end``), so no two confirmed sections' ``[start, end]`` may overlap;
- a lost section needs one instant in its acquire window ``[inv, start]``
  when the lock was free, i.e. outside every confirmed section's open
  ``(start, end)``: its lease may have run out right after it took effect.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass, field

__all__ = ["Linearization", "Section", "check_mutex", "linearizable"]


@dataclass(frozen=True)
class Section:
    """One critical section's operations, as instants (seconds)."""

    id: str
    inv: float  # acquire invoked
    start: float  # acquire completed
    end: float  # release invoked
    done: float  # release completed
    confirmed: bool  # the release succeeded: the lease was held throughout


@dataclass
class Linearization:
    """The verdict for one history: names and operations checked, and how
    many names no mutex explains."""

    names: int = 0
    operations: int = 0
    violations: int = 0
    notes: list[str] = field(default_factory=list)


def sections_of(events: list[dict]) -> dict[str, list[Section]]:
    """Group the ``cs`` events that carry invocation times by lock name."""
    by_name: dict[str, list[Section]] = defaultdict(list)
    for e in events:
        if e.get("k") != "cs" or "inv" not in e or "done" not in e:
            continue
        by_name[e["name"]].append(
            Section(
                id=e["id"],
                inv=e["inv"],
                start=e["start"],
                end=e["end"],
                done=e["done"],
                confirmed=e["rel"] == "ok",
            )
        )
    return by_name


def linearizable(sections: list[Section]) -> str | None:
    """Return None if a mutex explains ``sections``, else why not."""
    confirmed = sorted(
        (s for s in sections if s.confirmed), key=lambda s: (s.start, s.end)
    )
    for a, b in zip(confirmed, confirmed[1:]):
        if b.start < a.end:
            return (
                f"{b.id} acquired at {b.start:.4f} while {a.id} held it "
                f"until {a.end:.4f}"
            )
    starts = [s.start for s in confirmed]
    for s in sections:
        if s.confirmed:
            continue
        # The only confirmed section that could cover the whole window is the
        # last one to start before the window opens.
        i = bisect_left(starts, s.inv) - 1
        if i >= 0:
            a = confirmed[i]
            if a.start < s.inv and s.start < a.end and a.id != s.id:
                return (
                    f"{s.id} (lease lost) acquired within [{s.inv:.4f}, "
                    f"{s.start:.4f}], all of it while {a.id} held the lock"
                )
    return None


def check_mutex(events: list[dict]) -> Linearization:
    """Check every lock name's sections against a mutex."""
    result = Linearization()
    for name, sections in sections_of(events).items():
        result.names += 1
        result.operations += 2 * len(sections)
        why = linearizable(sections)
        if why is not None:
            result.violations += 1
            result.notes.append(f"{name[:40]!r}: not linearizable: {why}")
    return result
