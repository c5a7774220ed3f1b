"""One real browser: log in to the admin, see a held lock, release it, see it gone.

Headless Chromium from Debian's ``chromium`` package, driven by Playwright,
against pytest-django's live server. A missing browser skips locally and
fails under ``CI=true``.
"""

from __future__ import annotations

import os
import shutil

import pytest
from django.test import override_settings

from .conftest import redis_locks
from .procs import start_process
from .servers import unavailable
from .surface import hold_until_lost, is_listed, wait_until

CHROMIUM = os.environ.get("DISTLOCK_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
LOCK_NAME = "checkout:order-42 <b>not html</b>"

pytestmark = [pytest.mark.browser, pytest.mark.redis]


@pytest.fixture
def chromium():
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        unavailable(
            f"Chromium is not installed at {CHROMIUM} (apt-get install chromium)"
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("the playwright package is not installed")
    return sync_playwright


def test_admin_release_in_a_real_browser(
    chromium, live_server, django_user_model, redis_url, tmp_path
):
    django_user_model.objects.create_superuser("boss", "boss@example.com", "pw-123")
    outcome = tmp_path / "outcome"
    with override_settings(LOCKS=redis_locks(redis_url)):
        holder = start_process(hold_until_lost, LOCK_NAME, str(outcome), 60)
        try:
            wait_until(lambda: is_listed(LOCK_NAME), what="the holder process")
            # No Django ORM call below this point until the browser is closed:
            # Playwright's sync API runs an event loop in this thread.
            with chromium() as p:
                browser = p.chromium.launch(
                    executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
                )
                try:
                    page = browser.new_page()
                    page.set_default_timeout(30_000)
                    page.goto(
                        f"{live_server.url}/admin/login/"
                        "?next=/admin/django_distlock/lock/"
                    )
                    page.fill("#id_username", "boss")
                    page.fill("#id_password", "pw-123")
                    page.click("input[type=submit]")
                    page.wait_for_url("**/admin/django_distlock/lock/")
                    row = page.locator("#result_list tr.lock-row", has_text="order-42")
                    assert row.count() == 1
                    assert row.locator(".field-name").inner_text() == LOCK_NAME
                    assert str(holder.pid) in row.inner_text()
                    row.locator("input.action-select").check()
                    page.click("#release-selected")
                    page.wait_for_selector("text=Are you sure?")
                    assert LOCK_NAME in page.locator("#release-list").inner_text()
                    page.click("input[type=submit][value^='Yes']")
                    page.wait_for_url("**/admin/django_distlock/lock/")
                    assert (
                        "Released 1 lock" in page.locator(".messagelist").inner_text()
                    )
                    assert page.locator("#result_list tr.lock-row").count() == 0
                    assert (
                        "No locks are held."
                        in page.locator("#result_list").inner_text()
                    )
                finally:
                    browser.close()
            assert not is_listed(LOCK_NAME)
            wait_until(outcome.exists, what="the holder to leave its block")
            assert outcome.read_text() == "LockLost"
        finally:
            holder.kill()
            holder.join()
