"""Hypothesis-generated lock names under load: literal, separate, contained."""

from __future__ import annotations

import io
import json
import re

import pytest
from django.core.management import call_command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_distlock import lock, locks

from .conftest import backends
from .harness import LONG, Run

GLOBBY = st.text(
    alphabet=st.sampled_from(list("*?[]\\^!-a:{}%_\x00\n\t é")), max_size=12
)
ANY = st.text(alphabet=st.characters(exclude_categories=()), max_size=40)
LONG_NAMES = st.text(
    alphabet=st.sampled_from(list("ab*?[é\x01")), min_size=1000, max_size=10_000
)
NAME = st.one_of(GLOBBY, GLOBBY, ANY, LONG_NAMES).map(lambda s: "h:" + s)
#: Names the load workers use meanwhile: glob characters everywhere.
LOAD_NAMES = ["torture:*", "torture:?", "torture:[ab]", "torture:\\", "torture:"]


@pytest.mark.parametrize("kind", backends("redis", "redlock", "database"))
def test_generated_names_under_load(env, kind, tmp_path):
    """Distinct names never collide (all can be held at once), every key stays
    under KEY_PREFIX, listings give the names back exactly, and ``locks
    list/clear --prefix`` match literally."""
    run = Run(
        "hypothesis names under load",
        env,
        tmp_path,
        workers=2,
        names=LOAD_NAMES,
        records=("file",),
    ).start()
    backend = locks["default"]
    checked = [0]

    @settings(
        max_examples=40 if LONG else 8,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(NAME, min_size=1, max_size=5, unique=True), st.data())
    def example(names, data):
        handles = {}
        try:
            for name in names:
                handle = lock(name, ttl=30, timeout=0, auto_renew=False)
                assert handle.acquire(), f"{name[:60]!r} collided"
                handles[name] = handle
            for server in env.servers:
                client = server.client()
                for key in client.scan_iter(count=1000):
                    assert key.startswith(b"distlock:{"), key
                    assert len(key) < 100, key
                client.close()
            listed = {h.name for h in backend.holders("h:")}
            assert listed == set(names)
            base = data.draw(st.sampled_from(names))
            prefix = base[: data.draw(st.integers(2, len(base)))]
            expected = {n for n in names if n.startswith(prefix)}
            assert {h.name for h in backend.holders(prefix)} == expected
            out = io.StringIO()
            call_command(
                "locks", "list", "--prefix", prefix, "--format", "json", stdout=out
            )
            assert {row["name"] for row in json.loads(out.getvalue())} == expected
            out = io.StringIO()
            call_command("locks", "clear", "--prefix", prefix, "--noinput", stdout=out)
            cleared = int(re.search(r"Cleared (\d+)", out.getvalue()).group(1))
            assert cleared == len(expected), out.getvalue()
            for name, handle in handles.items():
                assert handle.locked() == (name not in expected), name[:60]
            checked[0] += len(names)
        finally:
            for handle in handles.values():
                try:
                    handle.release()
                except Exception:  # noqa: S110 - cleared ones report LockLost
                    pass

    example()
    verdict = run.finish(recovery=0)
    verdict.notes.append(f"{checked[0]} generated names checked")
