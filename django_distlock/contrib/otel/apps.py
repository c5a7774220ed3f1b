"""The app that traces the locks (see the package docstring)."""

from django.apps import AppConfig
from django.conf import settings


class OtelConfig(AppConfig):
    """Start making lock spans when Django starts."""

    name = "django_distlock.contrib.otel"
    label = "distlock_otel"
    verbose_name = "Distributed lock tracing"

    def ready(self) -> None:
        from . import install

        install(record_name=getattr(settings, "DISTLOCK_OTEL_LOCK_NAME", True))
