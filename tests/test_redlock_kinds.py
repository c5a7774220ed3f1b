"""Kinds on Redlock: what it declares, and that other kinds touch nothing.

Redlock offers exclusive locks only (see "Shared locks and semaphores" in
docs/backends/redlock.md: shared locks are sound on a quorum but not
implemented; semaphores are not sound with per-node counts). Five real
redis-server processes.
"""

from __future__ import annotations

import uuid

import pytest

from django_distlock.backends.kinds import EXCLUSIVE, SHARED, permit
from tests.servers import RedisServer
from tests.test_redlock import backend_for


@pytest.fixture(scope="module")
def nodes():
    servers = [RedisServer().start() for _ in range(5)]
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture
def backend(nodes):
    backend = backend_for(nodes)
    yield backend
    backend.close()


def test_declares_exclusive_only(backend):
    assert backend.kinds == {"exclusive"}


def test_other_kinds_have_no_holder_and_release_nothing(backend):
    name = f"kinds:{uuid.uuid4().hex}"
    lease = backend.acquire(name, 30, 0)
    assert lease is not None and lease.kind == EXCLUSIVE
    for kind in (SHARED, permit(2)):
        assert backend.holder_of(name, kind) is None
        assert backend.force_release(name, lease.token, kind) is False
    assert backend.is_held(lease)
    assert backend.holder_of(name, EXCLUSIVE).token == lease.token
    assert backend.force_release_many([(name, lease.token, EXCLUSIVE)]) == [True]
    assert not backend.is_held(lease)


def test_async_holder_of_takes_a_kind(backend):
    import asyncio

    name = f"akinds:{uuid.uuid4().hex}"
    lease = backend.acquire(name, 30, 0)

    async def main():
        return (
            await backend.aholder_of(name, SHARED),
            await backend.aholder_of(name, EXCLUSIVE),
        )

    shared, exclusive = asyncio.run(main())
    assert shared is None
    assert exclusive.token == lease.token
    backend.release(lease)
