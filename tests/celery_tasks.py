"""Tasks run by real Celery workers in tests/test_celery.py.

Each records what happened as one JSON line in a log file the test reads.
"""

from __future__ import annotations

import inspect
import json
import os
import time

from celery import current_task, shared_task

from django_distlock.contrib.celery import locked_task, task_skipped


def record(path: str, **fields) -> None:
    fields.update(pid=os.getpid(), worker=current_task.request.hostname, at=time.time())
    with open(path, "a") as f:
        f.write(json.dumps(fields) + "\n")


def wait_for(path: str | None, limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while path and not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


@task_skipped.connect
def log_skip(sender, task, name, holder, task_args, task_kwargs, **kwargs):
    log = inspect.signature(sender).bind(*task_args, **task_kwargs).arguments["log"]
    if log:
        record(log, event="skipped", task=task, lock=name, holder=holder.holder)


@shared_task
@locked_task("report:<tenant_id>", ttl=1)
def build_report(tenant_id, log, until=None):
    started = time.time()
    record(log, event="started", tenant=tenant_id)
    wait_for(until)
    record(log, event="ran", tenant=tenant_id, start=started, end=time.time())
    return f"report for {tenant_id}"


@shared_task(bind=True, max_retries=30)
@locked_task("sync:<account>", on_busy="retry", ttl=1)
def sync_account(self, account, log, seconds=1.5):
    started = time.time()
    time.sleep(seconds)
    record(
        log,
        event="ran",
        account=account,
        retries=self.request.retries,
        start=started,
        end=time.time(),
    )
    return self.request.retries


@shared_task
@locked_task("export:<name>", on_busy="raise", ttl=1)
def export(name, log, until=None):
    record(log, event="started", name=name)
    wait_for(until)
    return f"exported {name}"


@shared_task
@locked_task(lambda key, log: f"crash:{key}", ttl=1)
def crash(key, log):
    record(log, event="started", key=key)
    time.sleep(60)


@shared_task(time_limit=2)
@locked_task("limited:<key>", ttl=1)
def over_time_limit(key, log):
    record(log, event="started", key=key)
    time.sleep(60)
