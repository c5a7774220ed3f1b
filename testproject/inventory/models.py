from django.db import models


class Product(models.Model):
    """Something on sale, with a stock count."""

    sku = models.CharField(max_length=32, unique=True)
    stock = models.IntegerField(default=0)

    def __str__(self):
        return f"{self.sku} ({self.stock} left)"


class Order(models.Model):
    """One item sold."""

    product = models.ForeignKey(Product, on_delete=models.CASCADE)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return f"order {self.pk} of {self.product.sku}"
