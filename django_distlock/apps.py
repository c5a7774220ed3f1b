from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class DistlockConfig(AppConfig):
    """App config: registers the system checks."""

    name = "django_distlock"
    verbose_name = _("Distributed locks")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import (
            checks,  # noqa: F401  (registers the checks)
            view_checks,  # noqa: F401  (registers the view decorator's checks)
        )
