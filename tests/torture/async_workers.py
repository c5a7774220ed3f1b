"""An asyncio worker whose tasks are cancelled at random points.

Run in a spawned process (:func:`tests.procs.run_in_processes`).
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

from ..procs import barrier
from .history import EventLog
from .workers import record_key

#: Seconds a lane may run past the calm to hold its lock once after the storm.
RECOVERY_GRACE = 15.0


def cancel_storm(
    names: list[str],
    log_dir: str,
    files: str,
    storm: float,
    calm: float,
    ttl: float,
    lanes: int,
    seed: int,
    barrier_dir: str,
    parties: int,
) -> dict:
    """Run ``lanes`` loops of lock/write/unlock tasks.

    The ``parties`` processes start together (:func:`tests.procs.barrier` in
    ``barrier_dir``), so their storms end at the same moment. For ``storm``
    seconds about half of the tasks are cancelled after a random 0-4 ms
    (inside ``aacquire``, the critical section or ``arelease``), then for
    ``calm`` seconds none is; a lane that has not held its lock since the
    storm goes on until it has (for at most :data:`RECOVERY_GRACE` more
    seconds: a loaded host can make the calm too short for six lanes a name).
    Every task has finished before the loop ends, so nothing of ours is left
    running. Return counts and the end of the storm (monotonic).
    """
    from django_distlock import lock
    from django_distlock.exceptions import LockError, LockLost

    rng = random.Random(seed)
    stats = {"tasks": 0, "cancelled": 0}

    async def one(wid: str, log: EventLog, counter: list[int]) -> float | None:
        name = rng.choice(names)
        handle = lock(name, ttl=ttl, timeout=1.0)
        t0 = time.monotonic()
        try:
            ok = await handle.aacquire()
        except LockError as e:
            log.log(
                k="attempt",
                w=wid,
                t0=t0,
                t1=time.monotonic(),
                ok=False,
                err=type(e).__name__,
            )
            return None
        except asyncio.CancelledError:
            log.log(
                k="attempt",
                w=wid,
                t0=t0,
                t1=time.monotonic(),
                ok=False,
                err="cancelled",
            )
            raise
        log.log(k="attempt", w=wid, t0=t0, t1=time.monotonic(), ok=ok, err=None)
        if not ok:
            return None
        counter[0] += 1
        cs_id = f"{wid}.{counter[0]}"
        start = time.monotonic()
        token = handle.fencing_token
        write = {}
        rel = "not reached"
        end = None
        try:
            path = Path(files) / record_key(name)
            text = path.read_text() if path.exists() else ""
            await asyncio.sleep(rng.random() * 0.003)
            path.write_text(text + f"{token}:{cs_id},")
            write["file"] = "ok"
            end = time.monotonic()
        finally:
            end = end or time.monotonic()
            try:
                await handle.arelease()
                rel = "ok"
            except LockLost:
                rel = "LockLost"
            except asyncio.CancelledError:
                rel = "cancelled"
                raise
            except Exception as e:
                rel = type(e).__name__
            finally:
                if write:
                    log.log(
                        k="cs",
                        w=wid,
                        id=cs_id,
                        name=name,
                        inv=t0,
                        start=start,
                        end=end,
                        done=time.monotonic(),
                        token=token,
                        write=write,
                        rel=rel,
                    )
        # What the verdict counts as holding the lock again after the storm.
        return start if write and rel == "ok" else None

    async def lane(i: int, storm_end: float, calm_end: float) -> None:
        wid = f"a{seed}.{i}"
        log = EventLog(Path(log_dir) / f"{wid}.jsonl")
        log.log(k="ready", w=wid, pid=0, t=time.monotonic())
        counter = [0]
        recovered = False
        while time.monotonic() < calm_end or (
            not recovered and time.monotonic() < calm_end + RECOVERY_GRACE
        ):
            task = asyncio.ensure_future(one(wid, log, counter))
            stats["tasks"] += 1
            if time.monotonic() < storm_end and rng.random() < 0.5:
                asyncio.get_running_loop().call_later(rng.random() * 0.004, task.cancel)
            try:
                start = await task
            except asyncio.CancelledError:
                stats["cancelled"] += 1
            else:
                recovered = recovered or (start is not None and start > storm_end)

    async def main() -> float:
        barrier(barrier_dir, parties)
        now = time.monotonic()
        storm_end, calm_end = now + storm, now + storm + calm
        await asyncio.gather(*(lane(i, storm_end, calm_end) for i in range(lanes)))
        stats["free_after"], stats["probe_expired"] = await free_after_cancel(
            f"{names[0]}:probe:{seed}", 40, rng, ttl
        )
        return storm_end

    stats["storm_end"] = asyncio.run(main())
    return stats


async def free_after_cancel(
    name: str, rounds: int, rng: random.Random, ttl: float
) -> tuple[list[float], int]:
    """Cancel ``rounds`` acquisitions of the free ``name`` after 0-4 ms each.

    Return, for each one that was cancelled, how long the name then took to
    be acquirable by another handle (seconds): an acquisition that lands
    after its task was cancelled must not keep the name until its TTL. And
    how many of the other handle's leases expired, a TTL or more after it
    asked, before their release.
    """
    from django_distlock import lock
    from django_distlock.exceptions import LockLost

    async def take_and_give_back(acquired: list[bool]) -> None:
        # One task: a reentrant lock's owner is the task that took it.
        waiter = lock(name, ttl=ttl, timeout=1.0, auto_renew=False)
        if await waiter.aacquire():
            acquired.append(True)
            await waiter.arelease()

    delays = []
    expired = 0
    for _ in range(rounds):
        acquired: list[bool] = []
        task = asyncio.ensure_future(take_and_give_back(acquired))
        await asyncio.sleep(rng.random() * 0.004)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        started = time.monotonic()
        other = lock(name, ttl=ttl, timeout=0, auto_renew=False)
        while True:
            sent = time.monotonic()
            if await other.aacquire():
                break
            if sent - started > 2 * ttl:
                raise AssertionError(f"{name!r} still held {2 * ttl} s after a cancel")
            await asyncio.sleep(0.001)
        if task.cancelled() and not acquired:  # cancelled within aacquire
            delays.append(time.monotonic() - started)
        try:
            await other.arelease()
        except LockLost:
            # The lease began after ``sent``: gone before ``sent + ttl`` is a
            # bug; later, a loaded host (a SQLite writer waiting for the file
            # lock) let it expire, as designed.
            if time.monotonic() - sent < ttl:
                raise
            expired += 1
    return delays, expired
