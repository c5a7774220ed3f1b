"""A URLconf of shared-lock and semaphore views (tests/test_kinds.py), with
misconfigured ones (distlock.E026, E027): kept apart from tests/urls.py so
that the rest of the suite's system checks stay clean."""

from django.urls import path

from . import views_kinds as views

urlpatterns = [
    path("read/<str:pk>/", views.read_doc),
    path("aread/<str:pk>/", views.aread_doc),
    path("write/<str:pk>/", views.write_doc),
    path("export/<str:tenant>/", views.export),
    path("aexport/<str:tenant>/", views.aexport),
    path("both/<str:pk>/", views.shared_and_limit),
    path("zero/<str:pk>/", views.zero_limit),
    path("text/<str:pk>/", views.text_limit),
    path("shared-plain/<str:pk>/", views.shared_on_plain),
    path("semaphore-plain/<str:pk>/", views.semaphore_on_plain),
]
