"""A URLconf with a distributed_lock placeholder no route provides (distlock.E020).

Kept apart from tests/urls.py so that the rest of the suite's system checks
stay clean.
"""

from django.urls import include, path

from . import views

urlpatterns = [
    path("misconfigured/<str:sku>/", views.misconfigured),
    # Kwargs given by an enclosing route, or as extra kwargs, count.
    path("shop/<str:colour>/", include([path("<str:sku>/", views.misconfigured)])),
    path("fixed/<str:sku>/", views.misconfigured, {"colour": "red"}),
    path("cbv/<str:item>/", views.BuyView.as_view()),
]
