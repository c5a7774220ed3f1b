"""Django settings of the benchmark run.

The runner starts its own servers first and passes their addresses through
the environment, so that worker processes (spawned, not forked) see the same
configuration: ``DISTLOCK_BENCH_REDIS`` (one redis URL),
``DISTLOCK_BENCH_REDLOCK`` (comma-separated redis URLs) and
``DISTLOCK_BENCH_PG`` (a PostgreSQL database name; SQLite otherwise).
"""

import importlib.util
import os
import tempfile

from .servers import PG

SECRET_KEY = "benchmarks-only-not-secret"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "benchmarks.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("DISTLOCK_BENCH_REDIS", "redis://127.0.0.1:6379/0")
REDLOCK_URLS = [u for u in os.environ.get("DISTLOCK_BENCH_REDLOCK", "").split(",") if u]
PG_NAME = os.environ.get("DISTLOCK_BENCH_PG", "")

#: A SQLite file: the default database without PostgreSQL, and the ``lite``
#: one (the kinds scenario's SQLite rows) either way. Eight processes write
#: to it at once there, so a writer waits up to 20 s for the file's lock.
SQLITE = {
    "ENGINE": "django.db.backends.sqlite3",
    "NAME": os.environ.get(
        "DISTLOCK_BENCH_SQLITE",
        os.path.join(tempfile.gettempdir(), "distlock-bench.sqlite3"),
    ),
    "OPTIONS": {"timeout": 20},
}
if PG_NAME:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": PG_NAME,
            "USER": PG["user"],
            "HOST": PG["host"],
            "PORT": str(PG["port"]),
        },
        "lite": SQLITE,
    }
else:
    DATABASES = {"default": SQLITE}

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_distlock",
    "db_mutex",
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

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
    }
}


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


HAS_DATABASE_BACKEND = _has("django_distlock.backends.database")
HAS_REDLOCK_BACKEND = _has("django_distlock.backends.redlock")

LOCKS = {
    "default": {
        "BACKEND": "django_distlock.backends.redis.RedisLockBackend",
        "LOCATION": REDIS_URL,
    },
}
if HAS_DATABASE_BACKEND:
    LOCKS["db"] = {
        "BACKEND": "django_distlock.backends.database.DatabaseLockBackend",
        "OPTIONS": {"DATABASE": "default"},
    }
    LOCKS["lite"] = {
        **LOCKS["db"],
        "OPTIONS": {"DATABASE": "lite" if "lite" in DATABASES else "default"},
    }
if HAS_REDLOCK_BACKEND and len(REDLOCK_URLS) >= 3:
    LOCKS["quorum"] = {
        "BACKEND": "django_distlock.backends.redlock.RedlockBackend",
        "LOCATION": REDLOCK_URLS,
    }

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "root": {"level": "WARNING"},
}
