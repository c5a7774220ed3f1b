"""Views decorated with distributed_lock, for tests/test_decorators.py."""

import asyncio
import threading
import time

from asgiref.sync import sync_to_async
from django.db import transaction
from django.http import HttpResponse, JsonResponse
from django.utils.decorators import method_decorator
from django.views import View

from django_distlock import distributed_lock, lock, locks

from .testapp.models import Product


def _sell(sku: str, pause: float) -> HttpResponse:
    # A deliberately racy read-modify-write: only the lock keeps it right.
    product = Product.objects.get(sku=sku)
    if product.stock <= 0:
        return HttpResponse("sold out", status=410)
    time.sleep(pause)
    Product.objects.filter(pk=product.pk).update(stock=product.stock - 1)
    return HttpResponse("ok")


@distributed_lock("inventory:<sku>", timeout=5, ttl=5)
def buy(request, sku):
    return _sell(sku, float(request.GET.get("pause", 0)))


@distributed_lock("inventory:<sku>")
def buy_default(request, sku):
    return HttpResponse(f"bought {sku}")


@distributed_lock("inventory:<sku>", timeout=0.5)
def buy_waiting(request, sku):
    return HttpResponse(f"bought {sku}")


@distributed_lock("inventory:<sku>", timeout=0)
def buy_now(request, sku):
    return HttpResponse(f"bought {sku}")


@distributed_lock("inventory:<sku>", timeout=0)
async def abuy(request, sku):
    await asyncio.sleep(0)
    return HttpResponse(f"async bought {sku}")


@method_decorator(distributed_lock("cbv:<sku>", timeout=0), name="dispatch")
class BuyView(View):
    def get(self, request, sku):
        return HttpResponse(f"cbv bought {sku}")


@method_decorator(distributed_lock("acbv:<sku>", timeout=0), name="dispatch")
class AsyncBuyView(View):
    async def get(self, request, sku):
        return HttpResponse(f"async cbv bought {sku}")


@distributed_lock("inventory:<sku>:<colour>", timeout=0)
def misconfigured(request, sku, **kwargs):
    return HttpResponse("never")


@distributed_lock("bad:<sku>", using="nope")
def unknown_alias(request, sku):
    return HttpResponse("never")


@distributed_lock("bad:<sku>", ttl=-1, timeout=-3)
def bad_numbers(request, sku):
    return HttpResponse("never")


@method_decorator(
    distributed_lock("bad:<sku>", ttl="30", using=["not", "an", "alias"]),
    name="dispatch",
)
class BadTypesView(View):
    def get(self, request, sku):
        return HttpResponse("never")


def _clear_own_lock(name: str) -> None:
    # An operator's force-release while the view runs (locks clear NAME).
    backend = locks["default"]
    backend.force_release(name, backend.holder_of(name).token)


@distributed_lock("lost:<sku>")
def loses_its_lock(request, sku):
    _clear_own_lock(f"lost:{sku}")
    return HttpResponse("done anyway", status=201)


@distributed_lock("lost:<sku>")
async def aloses_its_lock(request, sku):
    await sync_to_async(_clear_own_lock)(f"lost:{sku}")
    return HttpResponse("async done anyway", status=201)


@distributed_lock("lost:<sku>")
def loses_and_raises(request, sku):
    _clear_own_lock(f"lost:{sku}")
    raise ValueError("the view's own error")


def teapot(request, exception):
    return HttpResponse(f"busy: {type(exception).__name__}", status=418)


@distributed_lock("inventory:<sku>", timeout=0, on_locked=teapot)
def buy_custom(request, sku):
    return HttpResponse("ok")


@distributed_lock(
    lambda request, *a, **kw: f"user:{request.GET.get('user')}", timeout=0
)
def by_callable(request):
    return HttpResponse("ok")


@distributed_lock("echo:<anything>", timeout=0)
def echo_name(request, anything):
    # Report the lock the decorator holds, as the backend lists it.
    held = [h.name for h in lock("x").backend.holders("echo:")]
    return JsonResponse({"held": held})


#: What on_commit hooks registered inside the atomic views saw.
COMMIT_PROBES: list[bool] = []


def _probe_after_commit(name: str) -> None:
    def probe():
        # Runs after the view's transaction commits, before any hook the
        # decorator registered later: is the lock still held then?
        result = []

        def attempt():
            handle = lock(name, timeout=0)
            got = handle.acquire()
            if got:
                handle.release()
            result.append(not got)

        thread = threading.Thread(target=attempt)
        thread.start()
        thread.join()
        COMMIT_PROBES.append(result[0])

    transaction.on_commit(probe)


@transaction.atomic
@distributed_lock("atomic:<sku>", timeout=0)
def buy_in_transaction(request, sku):
    _probe_after_commit(f"atomic:{sku}")
    return HttpResponse("ok")


@transaction.atomic
@distributed_lock("atomic:<sku>", timeout=0, release="on_exit")
def buy_in_transaction_on_exit(request, sku):
    _probe_after_commit(f"atomic:{sku}")
    return HttpResponse("ok")


@transaction.atomic
@distributed_lock("inventory:<sku>", timeout=10)
def buy_atomic(request, sku):
    # Read-modify-write inside the request's transaction (as ATOMIC_REQUESTS).
    return _sell(sku, float(request.GET.get("pause", 0)))
