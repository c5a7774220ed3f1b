"""A URLconf of misconfigured distributed_lock views (distlock.E020, E022, E023).

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
    # Bad arguments (distlock.E022, E023); routed twice, reported once.
    path("unknown-alias/<str:sku>/", views.unknown_alias),
    path("bad-numbers/<str:sku>/", views.bad_numbers),
    path("bad-numbers-again/<str:sku>/", views.bad_numbers),
    path("bad-types/<str:sku>/", views.BadTypesView.as_view()),
]
