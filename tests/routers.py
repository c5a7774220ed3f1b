"""The test suite's database router."""

from __future__ import annotations

import os

#: The aliases of tests/settings.py for a server that a test starts itself
#: (tests/db_servers.py), and the environment variable that gives its port
#: while it runs.
OWN_SERVERS = {
    "crashable": "DISTLOCK_CRASHABLE_PORT",
    "crashable_mysql": "DISTLOCK_CRASHABLE_MYSQL_PORT",
}


class OwnServersRouter:
    """Leave an alias of a server of a test's own out of migrations, and out
    of Django's checks of the models' fields, while that server is not
    running. Django 6.1 checks the fields on every alias, and the MySQL
    backend's check connects to the server."""

    def allow_migrate(self, db: str, app_label: str, **hints) -> bool | None:
        variable = OWN_SERVERS.get(db)
        if variable is not None and variable not in os.environ:
            return False
        return None
