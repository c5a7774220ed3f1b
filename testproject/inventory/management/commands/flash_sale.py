"""``manage.py flash_sale``: several processes buy the last items at once.

Each process drives the ``buy`` view (decorated with
``@distributed_lock("inventory:<sku>")``) through Django's test Client until
the product is sold out. The view's read-modify-write of the stock is not
atomic: only the lock keeps the sale from overselling. ``--unlocked`` uses
the same view without the lock, to show the oversell it prevents.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import sys
import time

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

SKU = "LAST-SNEAKERS"


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def shopper(
    settings_module: str, path: str, start, deadline: float
) -> dict[str, object]:
    """One process: buy until sold out. Return status counts and lock waits."""
    os.environ["DJANGO_SETTINGS_MODULE"] = settings_module
    import django

    django.setup()
    from django.test import Client

    from django_distlock.signals import lock_acquired, lock_contended

    waits: list[float] = []

    def record(sender, wait, **kwargs):
        waits.append(wait)

    lock_acquired.connect(record, weak=False)
    lock_contended.connect(record, weak=False)
    client = Client()
    statuses: dict[int, int] = {}
    start.wait()
    while time.time() < deadline:
        status = client.get(path).status_code
        statuses[status] = statuses.get(status, 0) + 1
        if status == 410:
            break
        if status in (423, 503):
            time.sleep(0.01)  # a real client would honour Retry-After
    return {"statuses": statuses, "waits": waits}


class Command(BaseCommand):
    help = "Run the flash-sale demo: processes racing to buy the last items."

    def add_arguments(self, parser):
        parser.add_argument("--stock", type=int, default=50)
        parser.add_argument("--processes", type=int, default=6)
        parser.add_argument(
            "--unlocked",
            action="store_true",
            help="Use the view without the lock (shows the oversell).",
        )
        parser.add_argument("--max-seconds", type=float, default=120)

    def handle(self, *args, stock, processes, unlocked, max_seconds, **options):
        from django_distlock import locks
        from inventory.models import Order, Product

        call_command("migrate", verbosity=0, interactive=False)
        Order.objects.filter(product__sku=SKU).delete()
        Product.objects.update_or_create(sku=SKU, defaults={"stock": stock})

        backend = locks["default"]
        where = {
            "DatabaseLockBackend": "the database backend on SQLite "
            "(zero configuration: no LOCKS setting)",
            "RedisLockBackend": f"Redis at {getattr(backend, 'location', '?')}",
        }.get(type(backend).__name__, type(backend).__name__)
        view = "buy-unlocked" if unlocked else "buy"
        self.stdout.write(
            f"Flash sale: {stock} items of {SKU}, {processes} processes buying "
            f"through /{view}/{SKU}/ ({'NO LOCK' if unlocked else 'locks: ' + where})"
        )

        ctx = multiprocessing.get_context("spawn")
        start = ctx.Manager().Event()
        started = time.monotonic()
        with ctx.Pool(processes) as pool:
            pending = [
                pool.apply_async(
                    shopper,
                    (
                        os.environ["DJANGO_SETTINGS_MODULE"],
                        f"/{view}/{SKU}/",
                        start,
                        time.time() + max_seconds,
                    ),
                )
                for _ in range(processes)
            ]
            start.set()
            results = [p.get(timeout=max_seconds + 60) for p in pending]
        elapsed = time.monotonic() - started

        statuses: dict[int, int] = {}
        waits: list[float] = []
        for result in results:
            for status, n in result["statuses"].items():
                statuses[status] = statuses.get(status, 0) + n
            waits.extend(result["waits"])
        sold = Order.objects.filter(product__sku=SKU).count()
        left = Product.objects.get(sku=SKU).stock
        oversold = max(0, sold - stock)
        requests = sum(statuses.values())

        line = self.stdout.write
        line("")
        line(f"  items sold:            {sold} of {stock}")
        line(f"  stock left in the DB:  {left}")
        style = self.style.SUCCESS if oversold == 0 else self.style.ERROR
        line(style(f"  oversold:              {oversold}"))
        line(f"  requests:              {requests} in {elapsed:.1f} s")
        line(f"    201 bought:          {statuses.get(201, 0)}")
        line(f"    423 locked, retried: {statuses.get(423, 0)}")
        line(f"    410 sold out:        {statuses.get(410, 0)}")
        other = {s: n for s, n in statuses.items() if s not in (201, 410, 423)}
        if other:
            line(f"    other:               {other}")
        if waits:
            line(
                f"  lock wait:             p50 {_percentile(waits, 50) * 1000:.1f} ms,"
                f" p99 {_percentile(waits, 99) * 1000:.1f} ms,"
                f" max {max(waits) * 1000:.1f} ms ({len(waits)} acquisitions; "
                f"mean {statistics.fmean(waits) * 1000:.1f} ms)"
            )
        line("")
        manage = os.path.relpath(os.path.join(settings.BASE_DIR, "manage.py"))
        python = os.path.relpath(os.path.join(os.path.dirname(sys.executable)))
        line("Watch the locks in the admin while a sale runs:")
        line(f"  {python}/python {manage} createsuperuser")
        line(f"  {python}/python {manage} runserver")
        line("  open http://127.0.0.1:8000/admin/django_distlock/lock/")
        line("  and run scripts/demo again in another terminal.")
        line(f"  (or list them here: {python}/python {manage} locks list)")
        if not unlocked:
            line("The same sale without the lock: scripts/demo --unlocked")
        if oversold and not unlocked:
            raise CommandError(f"Oversold {oversold} items: the lock failed.")
