"""Views decorated with distributed_lock(shared=...) / (limit=...), for
tests/test_kinds.py."""

import asyncio

from django.http import HttpResponse

from django_distlock import distributed_lock


@distributed_lock("doc:<pk>", shared=True)
def read_doc(request, pk):
    return HttpResponse(f"read {pk}")


@distributed_lock("doc:<pk>")
def write_doc(request, pk):
    return HttpResponse(f"wrote {pk}")


@distributed_lock("export:<tenant>", limit=2)
def export(request, tenant):
    return HttpResponse(f"exported {tenant}")


@distributed_lock("export:<tenant>", limit=2)
async def aexport(request, tenant):
    await asyncio.sleep(0)
    return HttpResponse(f"async exported {tenant}")


@distributed_lock("doc:<pk>", shared=True)
async def aread_doc(request, pk):
    await asyncio.sleep(0)
    return HttpResponse(f"async read {pk}")


# Misconfigured (distlock.E026, E027).


@distributed_lock("both:<pk>", shared=True, limit=3)
def shared_and_limit(request, pk):
    return HttpResponse("never")


@distributed_lock("zero:<pk>", limit=0)
def zero_limit(request, pk):
    return HttpResponse("never")


@distributed_lock("text:<pk>", limit="3")
def text_limit(request, pk):
    return HttpResponse("never")


@distributed_lock("plain:<pk>", using="plain", shared=True)
def shared_on_plain(request, pk):
    return HttpResponse("never")


@distributed_lock("plain:<pk>", using="plain", limit=2)
def semaphore_on_plain(request, pk):
    return HttpResponse("never")
