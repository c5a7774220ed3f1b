from django.db import models

from django_distlock.models import FencedModel


class Product(models.Model):
    sku = models.CharField(max_length=32, unique=True)
    stock = models.IntegerField(default=0)


class ProductProxy(Product):
    class Meta:
        proxy = True


class Account(FencedModel):
    owner = models.CharField(max_length=64)
    balance = models.IntegerField(default=0)


class SavingsAccount(Account):
    """Multi-table child of a fenced model: the token lives in the parent table."""

    rate = models.IntegerField(default=0)


class FencedListing(Product, FencedModel):
    """Multi-table child of an unfenced model: the token lives in the child table."""

    price = models.IntegerField(default=0)


class FencedSetting(FencedModel):
    """A fenced model whose primary key is chosen by the caller."""

    key = models.CharField(max_length=64, primary_key=True)
    value = models.TextField(blank=True, default="")
