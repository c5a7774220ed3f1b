from django.contrib import admin
from django.urls import path

from . import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("buy/<str:sku>/", views.buy),
    path("buy-now/<str:sku>/", views.buy_now),
    path("buy-default/<str:sku>/", views.buy_default),
    path("loses/<str:sku>/", views.loses_its_lock),
    path("aloses/<str:sku>/", views.aloses_its_lock),
    path("loses-and-raises/<str:sku>/", views.loses_and_raises),
    path("buy-waiting/<str:sku>/", views.buy_waiting),
    path("abuy/<str:sku>/", views.abuy),
    path("cbv/<str:sku>/", views.BuyView.as_view()),
    path("acbv/<str:sku>/", views.AsyncBuyView.as_view()),
    path("custom/<str:sku>/", views.buy_custom),
    path("by-callable/", views.by_callable),
    path("echo/<path:anything>", views.echo_name),
    path("tx/<str:sku>/", views.buy_in_transaction),
    path("tx-on-exit/<str:sku>/", views.buy_in_transaction_on_exit),
    path("buy-atomic/<str:sku>/", views.buy_atomic),
]
