"""The app that exports the lock metrics (see the package docstring)."""

from django.apps import AppConfig
from django.conf import settings
from django.utils.module_loading import import_string


class PrometheusConfig(AppConfig):
    """Register the lock metrics when Django starts."""

    name = "django_distlock.contrib.prometheus"
    label = "distlock_prometheus"
    verbose_name = "Distributed lock metrics"

    def ready(self) -> None:
        from . import install

        path = getattr(settings, "DISTLOCK_PROMETHEUS_REGISTRY", None)
        install(import_string(path) if path else None)
