"""An asyncio worker whose tasks are cancelled at random points.

Run in a spawned process (:func:`tests.procs.run_in_processes`).
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

from .history import EventLog
from .workers import record_key


def cancel_storm(
    names: list[str],
    log_dir: str,
    files: str,
    storm: float,
    calm: float,
    ttl: float,
    lanes: int = 6,
    seed: int = 0,
) -> dict:
    """Run ``lanes`` loops of lock/write/unlock tasks.

    For ``storm`` seconds about half of the tasks are cancelled after a random
    0-4 ms (inside ``aacquire``, the critical section or ``arelease``), then
    for ``calm`` seconds none is. Every task has finished before the loop
    ends, so nothing of ours is left running. Return counts and the end of
    the storm (monotonic).
    """
    from django_distlock import lock
    from django_distlock.exceptions import LockError, LockLost

    rng = random.Random(seed)
    stats = {"tasks": 0, "cancelled": 0}

    async def one(wid: str, log: EventLog, counter: list[int]) -> None:
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
            return
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
            return
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
                        start=start,
                        end=end,
                        token=token,
                        write=write,
                        rel=rel,
                    )

    async def lane(i: int, storm_end: float, calm_end: float) -> None:
        wid = f"a{seed}.{i}"
        log = EventLog(Path(log_dir) / f"{wid}.jsonl")
        log.log(k="ready", w=wid, pid=0, t=time.monotonic())
        counter = [0]
        while time.monotonic() < calm_end:
            task = asyncio.ensure_future(one(wid, log, counter))
            stats["tasks"] += 1
            if time.monotonic() < storm_end and rng.random() < 0.5:
                asyncio.get_running_loop().call_later(rng.random() * 0.004, task.cancel)
            try:
                await task
            except asyncio.CancelledError:
                stats["cancelled"] += 1

    async def main() -> float:
        now = time.monotonic()
        storm_end, calm_end = now + storm, now + storm + calm
        await asyncio.gather(*(lane(i, storm_end, calm_end) for i in range(lanes)))
        return storm_end

    stats["storm_end"] = asyncio.run(main())
    return stats
