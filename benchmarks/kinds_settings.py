"""The benchmark settings plus the database backend waking on NOTIFY.

Used by the kinds scenario's contention workers only: the ``db-notify``
alias is the ``db`` one (PostgreSQL) with ``OPTIONS["WAIT"] = "notify"``, so
that both ways of waiting are measured with the same processes.
"""

from .settings import *  # noqa: F403
from .settings import HAS_DATABASE_BACKEND, LOCKS, PG_NAME

if HAS_DATABASE_BACKEND and PG_NAME:
    LOCKS["db-notify"] = {
        **LOCKS["db"],
        "OPTIONS": {**LOCKS["db"]["OPTIONS"], "WAIT": "notify"},
    }
