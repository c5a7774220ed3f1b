"""The ``locks`` management command and the pieces its subcommands share."""

from __future__ import annotations

from django.core.management import CommandError

from ..handler import locks


def selected_aliases(using: str | None) -> list[str]:
    """Return the LOCKS aliases a ``--using`` option selects (all if None).

    Raise CommandError naming the configured aliases for an unknown one.
    """
    aliases = list(locks.settings)
    if using is None:
        return aliases
    if using not in aliases:
        raise CommandError(
            f"Unknown LOCKS alias {using!r}; configured: {', '.join(aliases)}."
        )
    return [using]
