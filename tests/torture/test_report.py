"""The availability-after-fault figure and the release table (pure logic)."""

from __future__ import annotations

from .history import Verdict, check, names_free_after
from .report import met, release_table


def cs(name: str, start: float, end: float, rel: str = "ok", w: str = "w0") -> dict:
    return {
        "k": "cs",
        "w": w,
        "id": f"{w}.{start}",
        "name": name,
        "inv": start - 0.001,
        "start": start,
        "end": end,
        "done": end + 0.001,
        "token": int(start * 1000),
        "write": {},
        "rel": rel,
    }


def test_slowest_name_counts():
    sections = [cs("a", 1, 2), cs("a", 5.5, 6), cs("b", 1, 2), cs("b", 7, 8)]
    assert names_free_after(sections, fault_end=5.0) == 2.0


def test_a_name_never_acquired_again_has_no_figure():
    sections = [cs("a", 1, 2), cs("a", 6, 7), cs("b", 1, 2)]
    assert names_free_after(sections, fault_end=5.0) is None
    verdict = check("s", "redis", sections, {}, fault_end=5.0)
    assert verdict.fault and met(verdict.as_dict()) == "not met"


def test_target_and_probe():
    verdict = check("s", "redis", [cs("a", 5.3, 5.4)], {}, fault_end=5.0)
    verdict.probe_free_after = 2.5
    row = verdict.as_dict()
    assert row["unavailable_after_fault"] == 2.5
    assert met(row) == "not met"
    verdict.target = 3.0  # a 3 s TTL
    assert met(verdict.as_dict()) == "met"


def test_release_table_counts_each_oracle():
    clean = check("s", "redis", [cs("a", 5.3, 5.4)], {}, fault_end=5.0).as_dict()
    overlapping = check(
        "t", "redlock", [cs("a", 1, 3), cs("a", 2, 4, w="w1")], {}
    ).as_dict()
    fork = Verdict("fork", "redis", critical_sections=2).as_dict()
    text = release_table([clean, overlapping, fork])
    assert "| s | redis | 1 | 0 | 0 | 0.30 s (0.30 s / n/a) | 2 s | met |" in text
    assert "| t | redlock | 2 | 1 | 1 |" in text
    assert "n/a (no fault window)" in text
    assert "3 runs, 5 critical sections checked by both oracles, 2 violations" in text


def test_a_grant_heard_late_is_no_overlap():
    # The PostgreSQL soak of the first release run: w1 was granted token 347,
    # then SIGSTOPped before the reply reached it; its lease lapsed, w2 took
    # token 384, and w1 resumed (and started its section) during w2's. The
    # tokens prove w1's grant came first; w1 reported the loss.
    w2 = {**cs("n", 1.0, 1.2, w="w2"), "token": 384}
    w1 = {**cs("n", 1.1, 1.3, rel="lost", w="w1"), "inv": 0.0, "token": 347}
    verdict = check("s", "postgres", [w2, w1], {})
    assert (verdict.overlaps, verdict.nonlinearizable) == (0, 0)
    assert verdict.reported_losses == 1
    # A later token in the same place is a second grant of a held lock.
    verdict = check("s", "postgres", [w2, {**w1, "token": 400}], {})
    assert verdict.overlaps == 1


def test_mutex_column_says_where_the_model_does_not_apply():
    nested = check("r", "reentrant", [cs("a", 1, 2)], {}, reentrant=True).as_dict()
    assert "| r | reentrant | 1 | 0 | n/a |" in release_table([nested])
