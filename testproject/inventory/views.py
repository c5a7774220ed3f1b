"""The flash-sale view: a racy read-modify-write, made safe by a lock."""

import time

from django.http import JsonResponse
from django.shortcuts import get_object_or_404

from django_distlock import distributed_lock

from .models import Order, Product

#: Time spent "taking the payment" between reading and writing the stock:
#: the window in which an unlocked view oversells.
PAYMENT_SECONDS = 0.002


def sell(sku):
    # Deliberately not atomic and not F()-based: read, think, write back.
    product = get_object_or_404(Product, sku=sku)
    if product.stock <= 0:
        return JsonResponse({"sold": False, "reason": "sold out"}, status=410)
    time.sleep(PAYMENT_SECONDS)
    product.stock -= 1
    product.save(update_fields=["stock"])
    Order.objects.create(product=product)
    return JsonResponse({"sold": True, "left": product.stock}, status=201)


@distributed_lock("inventory:<sku>", timeout=0.5)
def buy(request, sku):
    """Buy one item; only one request per SKU runs this at a time."""
    return sell(sku)


def buy_unlocked(request, sku):
    """The same view without the lock, to show what it prevents."""
    return sell(sku)
