"""Histories of critical sections, and the checker that judges them.

Every worker appends one JSON line per event to a log file of its own
(``O_APPEND``, one ``write`` per line, so a paused or killed worker leaves
whole lines). Times are :func:`time.monotonic` readings, which on Linux come
from one system-wide clock, so intervals from different processes compare.

Events:

``{"k": "attempt", "w", "t0", "t1", "ok", "err"}``
    One acquisition attempt: started at ``t0``, answered at ``t1``; ``ok`` if
    the lock was acquired, ``err`` the exception class name if one was raised.
``{"k": "cs", "w", "id", "name", "start", "end", "token", "write", "rel"}``
    One critical section, from just after the acquisition returned to just
    before the release was sent. ``write`` is what the shared-record write
    reported (``ok``, ``stale``, ``lost``, ``error:...``), ``rel`` what the
    release reported (``ok``, ``LockLost``, ``LockBackendError``, ...).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .linearizable import check_mutex

__all__ = ["EventLog", "Verdict", "check", "read_events"]


class EventLog:
    """Append-only JSON lines, one ``write`` per event."""

    def __init__(self, path: str | os.PathLike):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def log(self, **event) -> None:
        os.write(self.fd, (json.dumps(event) + "\n").encode())


def read_events(directory: str | os.PathLike) -> list[dict]:
    """Return every event logged under ``directory`` (``*.jsonl``)."""
    events = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                try:
                    events.append(json.loads(line))
                except ValueError:  # a line cut by SIGKILL: not an event
                    pass
    return events


@dataclass
class Verdict:
    """What the checker found in one scenario's history."""

    scenario: str
    backend: str
    critical_sections: int = 0
    confirmed: int = 0
    attempts: int = 0
    acquired: int = 0
    backend_errors: int = 0
    longest_wait: float = 0.0
    overlaps: int = 0
    lost_updates: int = 0
    stale_accepted: int = 0
    misreported_writes: int = 0
    token_regressions: int = 0
    contract_errors: int = 0
    nonlinearizable: int = 0
    #: Whether the mutex model judged the history (not for reentrant
    #: backends or readers and writers and permits, which it does not model).
    mutex_checked: bool = False
    fenced_off: int = 0
    reported_losses: int = 0
    recovered_workers: int = 0
    workers: int = 0
    #: Seconds from the fault's end until every lock name of the run was
    #: acquired again (the slowest name), and until the prober's name was;
    #: None when the scenario has no fault window (or nothing was measured).
    fault: bool = False  # the run had a fault window
    names_free_after: float | None = None
    probe_free_after: float | None = None
    #: The availability target: 2 s, or the TTL when longer (a holder that
    #: really lost its lease may leave its remaining TTL behind).
    target: float = 2.0
    notes: list[str] = field(default_factory=list)

    @property
    def availability(self) -> float:
        return self.acquired / self.attempts if self.attempts else 0.0

    @property
    def unavailable_after_fault(self) -> float | None:
        """Return the longest time until a name was acquirable after the fault."""
        gaps = [
            g for g in (self.names_free_after, self.probe_free_after) if g is not None
        ]
        return max(gaps) if gaps else None

    @property
    def interval_violations(self) -> int:
        """Return the violations the interval checker (not the mutex model) found."""
        return self.violations - self.nonlinearizable

    @property
    def violations(self) -> int:
        return (
            self.overlaps
            + self.lost_updates
            + self.stale_accepted
            + self.misreported_writes
            + self.token_regressions
            + self.contract_errors
            + self.nonlinearizable
        )

    def as_dict(self) -> dict:
        data = asdict(self)
        data["availability"] = round(self.availability, 4)
        data["violations"] = self.violations
        data["longest_wait"] = round(self.longest_wait, 3)
        data["interval_violations"] = self.interval_violations
        gap = self.unavailable_after_fault
        data["unavailable_after_fault"] = None if gap is None else round(gap, 3)
        return data

    def summary(self) -> str:
        return (
            f"{self.scenario} [{self.backend}]: {self.critical_sections} critical "
            f"sections ({self.confirmed} confirmed), {self.violations} violations "
            f"(overlaps {self.overlaps}, lost updates {self.lost_updates}, stale "
            f"writes accepted {self.stale_accepted}, misreported "
            f"{self.misreported_writes}, token regressions "
            f"{self.token_regressions}, contract errors {self.contract_errors}, "
            f"names no mutex explains {self.nonlinearizable}); "
            f"fenced off {self.fenced_off}, losses "
            f"reported {self.reported_losses}; availability "
            f"{self.availability:.1%} of {self.attempts} attempts, longest wait "
            f"{self.longest_wait:.2f} s; {self.recovered_workers}/{self.workers} "
            f"workers acquired after the fault"
            + (
                ""
                if self.unavailable_after_fault is None
                else f"; names acquirable again {self.unavailable_after_fault:.2f} s "
                f"after the fault (target {self.target:.1f} s)"
            )
        )


def names_free_after(sections: list[dict], fault_end: float) -> float | None:
    """Return how long after ``fault_end`` the slowest lock name was acquired
    again (the first section of each name that started after it), or None
    if some name never was.

    The workers keep trying every name, so the first grant after the fault
    is when the name became acquirable again, give or take one attempt.
    """
    first: dict[str, float] = {}
    for s in sections:
        if s["start"] > fault_end:
            name = s["name"]
            first[name] = min(first.get(name, s["start"]), s["start"])
    names = {s["name"] for s in sections}
    if not names or set(first) != names:
        return None
    return max(first.values()) - fault_end


def _history(text: str) -> list[tuple[int, str]]:
    """Parse a record's ``token:id,`` entries (token 0 for unfenced records)."""
    entries = []
    for item in text.split(","):
        if item:
            token, _, cs_id = item.partition(":")
            entries.append((int(token), cs_id))
    return entries


def _granted_before(late: dict, section: dict) -> bool:
    """Whether ``late``, which started during ``section``, was granted before
    it: its holder heard of the grant late, its lease lapsed meanwhile (so it
    reported the loss), and the tokens prove the order of the grants."""
    a, b = late.get("token"), section.get("token")
    return late["rel"] != "ok" and isinstance(a, int) and isinstance(b, int) and a < b


def check(
    scenario: str,
    backend: str,
    events: list[dict],
    records: dict[str, dict[str, str]],
    fault_end: float | None = None,
    reentrant: bool = False,
) -> Verdict:
    """Judge a history.

    ``records`` maps a record kind (``file``, ``redis``, ``fenced``) to the
    final contents of each lock name's record. Counted as violations:

    - overlaps: two critical sections of one name that overlap in time while
      the earlier one's release succeeded (it held the lease all along, so
      the later one was granted a lock that was not free). Overlaps with an
      earlier section whose loss was reported (``LockLost``, or a backend
      error at release) are the fencing case and are counted apart, and so
      are overlaps with a later section that reported its loss and holds a
      smaller fencing token: it was granted first and heard of it late
      (paused, or its reply delayed), after its lease had lapsed;
    - lost updates: a section that wrote successfully and released
      successfully whose entry is missing from a record;
    - stale writes accepted: a fenced record whose accepted tokens do not
      strictly increase;
    - misreported writes: a fenced write reported as rejected whose entry is
      in the record anyway;
    - token regressions: successive confirmed sections of one name whose
      fencing tokens do not strictly increase;
    - contract errors: an acquisition that raised something other than a
      LockError (the contract says LockBackendError when the backend fails);
    - names no mutex explains: the second oracle
      (:mod:`tests.torture.linearizable`), a linearizability check of each
      name's acquires and releases, with their invocation and completion
      times, against a mutex (not for reentrant backends, whose nested
      holds a mutex does not model).
    """
    verdict = Verdict(scenario=scenario, backend=backend)
    sections = [e for e in events if e["k"] == "cs"]
    attempts = [e for e in events if e["k"] == "attempt"]
    verdict.critical_sections = len(sections)
    verdict.attempts = len(attempts)
    verdict.acquired = sum(1 for a in attempts if a["ok"])
    verdict.backend_errors = sum(1 for a in attempts if a.get("err"))
    verdict.longest_wait = max((a["t1"] - a["t0"] for a in attempts), default=0.0)
    # An acquisition may fail with a LockError (or be cancelled); anything else
    # breaks the contract (e.g. a RuntimeError escaping from the backend).
    unexpected = [
        a["err"] for a in attempts if (a.get("err") or "").startswith("unexpected")
    ]
    verdict.contract_errors = len(unexpected)
    if unexpected:
        verdict.notes.append(f"contract errors: {sorted(set(unexpected))[:3]}")
    confirmed = [s for s in sections if s["rel"] == "ok"]
    verdict.confirmed = len(confirmed)
    verdict.reported_losses = sum(1 for s in sections if s["rel"] != "ok")

    by_name = defaultdict(list)
    for s in sections:
        by_name[s["name"]].append(s)
    for items in by_name.values():
        items.sort(key=lambda s: s["start"])
        for i, earlier in enumerate(items):
            for later in items[i + 1 :]:
                if later["start"] >= earlier["end"]:
                    break
                if reentrant and later["w"] == earlier["w"]:
                    continue
                if _granted_before(later, earlier):
                    continue
                if earlier["rel"] == "ok":
                    verdict.overlaps += 1
                    verdict.notes.append(
                        f"overlap on {earlier['name'][:40]!r}: {earlier['id']} "
                        f"[{earlier['start']:.4f}, {earlier['end']:.4f}] "
                        f"released ok, {later['id']} started "
                        f"{later['start']:.4f}"
                    )
        tokens = [s["token"] for s in items if s["rel"] == "ok"]
        for a, b in zip(tokens, tokens[1:]):
            if b <= a:
                verdict.token_regressions += 1
                verdict.notes.append(f"token went from {a} to {b}")

    by_id = {s["id"]: s for s in sections}
    for kind, contents in records.items():
        for name, text in contents.items():
            history = _history(text)
            present = {cs_id for _, cs_id in history}
            for s in by_name.get(name, []):
                if kind in s["write"] and s["write"][kind] == "ok" and s["rel"] == "ok":
                    if s["id"] not in present:
                        verdict.lost_updates += 1
                        verdict.notes.append(f"{kind} record lost {s['id']}")
            if kind == "fenced":
                tokens = [t for t, _ in history]
                for a, b in zip(tokens, tokens[1:]):
                    if b <= a:
                        verdict.stale_accepted += 1
                        verdict.notes.append(f"fenced record accepted {b} after {a}")
                for _, cs_id in history:
                    s = by_id.get(cs_id)
                    if s is not None and s["write"].get(kind) == "stale":
                        verdict.misreported_writes += 1
        verdict.fenced_off += sum(
            1 for s in sections if s["write"].get(kind) in ("stale", "lost")
        )

    if not reentrant:
        mutex = check_mutex(events)
        verdict.mutex_checked = True
        verdict.nonlinearizable = mutex.violations
        verdict.notes.extend(mutex.notes[:3])

    workers = {e["w"] for e in events if e["k"] in ("attempt", "ready")}
    verdict.workers = len(workers)
    if fault_end is not None:
        verdict.recovered_workers = len(
            {s["w"] for s in sections if s["start"] > fault_end and s["rel"] == "ok"}
        )
        verdict.fault = True
        verdict.names_free_after = names_free_after(sections, fault_end)
    else:
        verdict.recovered_workers = len({s["w"] for s in sections})
    return verdict
