"""Take the admin screenshots of the docs (docs/img/*.png).

Run from the repository root: ``.venv/bin/python docs/img/screenshots.py``.
It needs Debian's ``chromium`` and the ``playwright`` package (both in the
test set-up). A throwaway project in a temporary directory, local-memory
locks held by this process, a live server on a free loopback port: nothing
outside the temporary directory is touched.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from pathlib import Path

import django
from django.conf import settings
from django.urls import path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
TMP = tempfile.mkdtemp(prefix="distlock-shots-")

settings.configure(
    DEBUG=True,
    SECRET_KEY="screenshots-only",
    ALLOWED_HOSTS=["127.0.0.1"],
    ROOT_URLCONF=__name__,
    USE_TZ=True,
    TIME_ZONE="UTC",
    DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    STATIC_URL="/static/",
    INSTALLED_APPS=[
        "django.contrib.admin",
        "django.contrib.auth",
        "django.contrib.contenttypes",
        "django.contrib.sessions",
        "django.contrib.messages",
        "django.contrib.staticfiles",
        "django_distlock",
    ],
    MIDDLEWARE=[
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.common.CommonMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
    ],
    TEMPLATES=[
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
    ],
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.path.join(TMP, "db.sqlite3"),
        }
    },
    LOCKS={
        "default": {"BACKEND": "django_distlock.backends.locmem.LocMemLockBackend"},
        "reports": {
            "BACKEND": "django_distlock.backends.locmem.LocMemLockBackend",
            "LOCATION": "reports",
        },
    },
)
django.setup()

from django.contrib import admin  # noqa: E402

urlpatterns = [path("admin/", admin.site.urls)]


def main() -> None:
    from django.contrib.auth.models import User
    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.core.management import call_command
    from django.test.testcases import LiveServerThread
    from playwright.sync_api import sync_playwright

    from django_distlock import lock

    call_command("migrate", verbosity=0)
    User.objects.create_superuser("admin", "admin@example.com", "admin")

    held = [
        lock("shop.product:42", ttl=30),
        lock("shop.product:7", ttl=30),
        lock("inventory:mug-blue", ttl=10),
        lock("report:daily", using="reports", ttl=300),
        lock("import:catalogue", using="reports", ttl=600),
    ]
    done = threading.Event()
    for i, handle in enumerate(held):
        # Hold each lock from a thread of its own, as separate requests would.
        ready = threading.Event()

        def hold(handle=handle, ready=ready):
            handle.acquire()
            ready.set()
            done.wait()

        thread = threading.Thread(target=hold, name=f"worker-{i + 1}", daemon=True)
        thread.start()
        ready.wait()

    server = LiveServerThread("127.0.0.1", StaticFilesHandler, port=0)
    server.daemon = True
    server.start()
    server.is_ready.wait()
    if server.error:
        raise server.error
    base = f"http://127.0.0.1:{server.port}"

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium")
        page = browser.new_page(viewport={"width": 1280, "height": 500})
        page.goto(base + "/admin/login/?next=/admin/")
        page.fill("#id_username", "admin")
        page.fill("#id_password", "admin")
        page.click("input[type=submit]")
        page.goto(base + "/admin/django_distlock/lock/")
        page.click("#toggle-nav-sidebar")  # more room for the table
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(HERE / "admin-locks.png"))
        browser.close()
    done.set()
    server.terminate()
    print("wrote", HERE / "admin-locks.png")


if __name__ == "__main__":
    main()
