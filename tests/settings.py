"""Settings for the test suite.

Databases: ``DISTLOCK_TEST_DB`` picks the default database engine the tests
run on (``sqlite`` by default, ``postgres`` or ``mysql``); the other two are
always configured as the ``postgres`` and ``mysql`` aliases for the database
backend's own tests, and ``pgbouncer`` is that PostgreSQL behind a PgBouncer.
``DISTLOCK_TEST_DB_SUFFIX`` keeps concurrent runs apart.
"""

import os

SUFFIX = os.environ.get("DISTLOCK_TEST_DB_SUFFIX", "")
SECRET_KEY = "tests-only-not-secret"
DEBUG = True
USE_TZ = True
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# The live server (tests/test_browser.py) serves static and media URLs: they
# must be set.
STATIC_URL = "/static/"

try:  # MariaDB through the pure-Python driver
    import pymysql

    pymysql.install_as_MySQLdb()
except ImportError:
    pass

POSTGRES = {
    "ENGINE": "django.db.backends.postgresql",
    "NAME": "test",
    "USER": "postgres",
    "HOST": os.environ.get("DISTLOCK_PG_HOST", "127.0.0.1"),
    "PORT": os.environ.get("DISTLOCK_PG_PORT", "5432"),
    "TEST": {"NAME": f"test_distlock{SUFFIX}"},
}
MYSQL = {
    "ENGINE": "django.db.backends.mysql",
    "NAME": "test",
    "USER": "root",
    "PASSWORD": "",
    "HOST": os.environ.get("DISTLOCK_MYSQL_HOST", "127.0.0.1"),
    "PORT": os.environ.get("DISTLOCK_MYSQL_PORT", "3306"),
    "OPTIONS": {"charset": "utf8mb4"},
    "TEST": {"NAME": f"test_distlock{SUFFIX}", "CHARSET": "utf8mb4"},
}
SQLITE = {
    "ENGINE": "django.db.backends.sqlite3",
    "NAME": os.path.join(
        os.environ.get("DISTLOCK_TMP", "/tmp"), f"distlock{SUFFIX}.sqlite3"
    ),
    "TEST": {
        "NAME": os.path.join(
            os.environ.get("DISTLOCK_TMP", "/tmp"), f"test_distlock{SUFFIX}.sqlite3"
        )
    },
    "OPTIONS": {"timeout": 20},
}
_main = {"sqlite": SQLITE, "postgres": POSTGRES, "mysql": MYSQL}[
    os.environ.get("DISTLOCK_TEST_DB", "sqlite")
]
# The same PostgreSQL through a PgBouncer in transaction pooling mode that
# tests/test_pgbouncer.py starts (it sets the port, and the test database's
# name at run time). Django's documented setting for such a pooler:
# DISABLE_SERVER_SIDE_CURSORS.
PGBOUNCER = {
    **POSTGRES,
    "PORT": os.environ.get("DISTLOCK_PGBOUNCER_PORT", "6432"),
    "DISABLE_SERVER_SIDE_CURSORS": True,
    "TEST": {"NAME": f"test_distlock{SUFFIX}", "MIRROR": "postgres"},
}
# The same PostgreSQL through tests/faultproxy.py, which loses replies on
# demand (tests/test_in_doubt.py sets the port at run time).
PROXIED = {
    **POSTGRES,
    "PORT": os.environ.get("DISTLOCK_PROXY_PORT", "6433"),
    "TEST": {"NAME": f"test_distlock{SUFFIX}", "MIRROR": "postgres"},
}
# A PostgreSQL server of a test's own, which tests/pg_server.py starts,
# kills, pauses and restarts for the crash, partition and torture tests (it
# sets the port at run time, and creates the test database's name there).
CRASHABLE = {
    **POSTGRES,
    "PORT": os.environ.get("DISTLOCK_CRASHABLE_PORT", "6434"),
    "TEST": {"NAME": f"test_distlock{SUFFIX}", "MIRROR": "postgres"},
}
# A MariaDB server of a test's own, which tests/mariadb_server.py starts,
# kills, pauses and restarts for the crash, partition and torture tests (it
# sets the port at run time, and creates the test database's name there).
CRASHABLE_MYSQL = {
    **MYSQL,
    "PORT": os.environ.get("DISTLOCK_CRASHABLE_MYSQL_PORT", "3307"),
    "TEST": {"NAME": f"test_distlock{SUFFIX}", "MIRROR": "mysql"},
}
DATABASES = {
    "default": _main,
    "proxied": PROXIED,
    "postgres": POSTGRES,
    "mysql": MYSQL,
    "pgbouncer": PGBOUNCER,
    "crashable": CRASHABLE,
    "crashable_mysql": CRASHABLE_MYSQL,
}
DATABASE_ROUTERS = ["tests.routers.OwnServersRouter"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    # The live server serves the admin's CSS and JS from the apps, so that the
    # browser tests see (and screenshot) the page as users do.
    "django.contrib.staticfiles",
    "django_distlock",
    "tests.testapp",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# Tests point LOCKS at the redis-server they start (see tests/conftest.py);
# until then, everything runs in-process.
LOCKS = {
    "default": {"BACKEND": "django_distlock.backends.locmem.LocMemLockBackend"},
}
