from django.contrib import admin
from django.urls import path
from inventory import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("buy/<str:sku>/", views.buy, name="buy"),
    path("buy-unlocked/<str:sku>/", views.buy_unlocked, name="buy-unlocked"),
]
