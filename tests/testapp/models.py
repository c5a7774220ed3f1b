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
