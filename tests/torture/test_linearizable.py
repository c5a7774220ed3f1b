"""The mutex linearizability oracle against an exhaustive search."""

from __future__ import annotations

from itertools import permutations

from hypothesis import given, settings
from hypothesis import strategies as st

from .linearizable import Section, check_mutex, linearizable


def exhaustive(sections: list[Section]) -> bool:
    """Try every order; in each, every operation at its earliest instant
    (a later instant never helps a mutex)."""
    for order in permutations(sections):
        free = float("-inf")
        for s in order:
            point = max(s.inv, free)
            if point > s.start:
                break
            free = max(point, s.end) if s.confirmed else point
        else:
            return True
    return False


@st.composite
def histories(draw):
    sections = []
    for i in range(draw(st.integers(0, 5))):
        inv, start, end, done = sorted(
            draw(st.lists(st.integers(0, 20), min_size=4, max_size=4))
        )
        sections.append(Section(f"w.{i}", inv, start, end, done, draw(st.booleans())))
    return sections


@settings(max_examples=3000, deadline=None)
@given(histories())
def test_agrees_with_every_order(sections):
    assert (linearizable(sections) is None) == exhaustive(sections)


def test_lost_lease_may_have_lapsed_before_the_next_holder():
    # B's acquire took effect before A's (then B's lease lapsed): a mutex
    # explains it, although B heard of its grant while A held the lock.
    a = Section("a", inv=2, start=2, end=5, done=5, confirmed=True)
    b = Section("b", inv=1, start=3, end=4, done=4, confirmed=False)
    assert linearizable([a, b]) is None
    late = Section("b", inv=2.5, start=3, end=4, done=4, confirmed=False)
    assert "all of it while a held the lock" in linearizable([a, late])


def test_check_mutex_reads_the_workers_events():
    events = [
        {
            "k": "cs",
            "id": "1.1",
            "name": "n",
            "inv": 0,
            "start": 1,
            "end": 2,
            "done": 2.1,
            "rel": "ok",
        },
        {
            "k": "cs",
            "id": "2.1",
            "name": "n",
            "inv": 0,
            "start": 1.5,
            "end": 3,
            "done": 3.1,
            "rel": "ok",
        },
        {"k": "cs", "id": "3.1", "name": "m", "start": 0, "end": 1, "rel": "ok"},
    ]
    verdict = check_mutex(events)
    assert (verdict.names, verdict.operations, verdict.violations) == (1, 4, 1)
