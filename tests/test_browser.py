"""A real browser on the admin Locks page: release a lock, and use the page.

Headless Chromium from Debian's ``chromium`` package, driven by Playwright,
against pytest-django's live server. A missing browser skips locally and
fails under ``CI=true``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from django.test import override_settings

from django_distlock import LockLost, lock

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


#: Where the docs' screenshots go: docs/img with
#: DISTLOCK_UPDATE_SCREENSHOTS=1, else a temporary directory, so that a run
#: of the suite leaves the checkout as it found it.
DOCS_IMG = Path(__file__).resolve().parent.parent / "docs" / "img"
LONG_NAME = "export:tenant-acme/2026-11/" + "quarterly-ledger-reconciliation-" * 12
HELD = [
    ("default", "shop.product:42"),
    ("default", "shop.product:7"),
    ("default", "inventory:mug-blue"),
    ("default", LONG_NAME),
    ("reports", "report:daily"),
    ("reports", "import:catalogue"),
]


def fits(page, width: int) -> None:
    """Assert that every column of the table is in view at ``width`` px."""
    page.set_viewport_size({"width": width, "height": 700})
    box = page.evaluate(
        """() => {
            const results = document.querySelector("#changelist .results");
            const cells = document.querySelectorAll(
                "#result_list td.field-fencing-token");
            return {
                right: Math.max(...Array.from(cells).map(
                    (cell) => cell.getBoundingClientRect().right)),
                visible: Math.min(
                    results.getBoundingClientRect().right, window.innerWidth),
                hidden: results.scrollWidth - results.clientWidth,
                page: document.documentElement.scrollWidth,
            };
        }"""
    )
    if box["right"] > box["visible"] or box["hidden"] > 0 or box["page"] > width:
        page.screenshot(path=f"/tmp/distlock-overflow-{width}.png", full_page=True)
    assert box["right"] <= box["visible"], box
    assert box["hidden"] <= 0 and box["page"] <= width, box


def test_admin_usability_in_a_real_browser(
    chromium, live_server, django_user_model, redis_url, tmp_path
):
    """Long names, select all, filters kept through a release, a total; and the
    docs' screenshots, taken from this live page at 1280 and 800 px."""
    shots = DOCS_IMG if os.environ.get("DISTLOCK_UPDATE_SCREENSHOTS") else tmp_path
    from django.contrib.admin.models import CHANGE, LogEntry

    django_user_model.objects.create_superuser("boss", "boss@example.com", "pw-123")
    setting = redis_locks(redis_url)
    setting["reports"] = {**setting["default"], "KEY_PREFIX": "reports"}
    with override_settings(LOCKS=setting):
        handles = [lock(name, using=alias, ttl=60, timeout=0) for alias, name in HELD]
        for handle in handles:
            assert handle.acquire()
        try:
            with chromium() as p:
                browser = p.chromium.launch(
                    executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
                )
                try:
                    page = browser.new_page(viewport={"width": 1280, "height": 700})
                    page.set_default_timeout(30_000)
                    page.goto(
                        f"{live_server.url}/admin/login/"
                        "?next=/admin/django_distlock/lock/"
                    )
                    page.fill("#id_username", "boss")
                    page.fill("#id_password", "pw-123")
                    page.click("input[type=submit]")
                    page.wait_for_url("**/admin/django_distlock/lock/")
                    page.click("#toggle-nav-sidebar")  # as a wide table would
                    assert "Locks 1–6 of 6" in page.locator(".paginator").inner_text()

                    # A long name is cut, whole on hover, and pushes nothing out.
                    cut = page.locator(".field-name .lock-cut", has_text="export:")
                    assert cut.get_attribute("title") == LONG_NAME
                    assert cut.bounding_box()["width"] < 400
                    fits(page, 1280)
                    page.screenshot(path=str(shots / "admin-locks.png"))
                    fits(page, 800)
                    page.screenshot(path=str(shots / "admin-locks-800.png"))
                    page.set_viewport_size({"width": 1280, "height": 700})

                    # Search and filter, then select all.
                    page.fill("#searchbar", "shop.product")
                    page.press("#searchbar", "Enter")
                    page.wait_for_url("**/lock/?q=shop.product")
                    page.click("#changelist-filter a:text-is('default')")
                    page.wait_for_url("**/lock/?q=shop.product&backend=default")
                    rows = page.locator("#result_list tr.lock-row")
                    assert rows.count() == 2
                    page.check("#action-toggle")
                    assert page.locator("input.action-select:checked").count() == 2
                    assert page.inner_text("#selected-count") == "2 of 2 selected"
                    page.locator("input.action-select").first.uncheck()
                    assert page.evaluate(
                        "document.getElementById('action-toggle').indeterminate"
                    )
                    page.check("#action-toggle")

                    # Confirm, cancel: back to the same list.
                    page.click("#release-selected")
                    page.wait_for_selector("text=Are you sure?")
                    page.click("a.cancel-link")
                    page.wait_for_url("**/lock/?q=shop.product&backend=default")
                    assert page.input_value("#searchbar") == "shop.product"
                    assert rows.count() == 2

                    # Confirm, release: back to the same list, now empty.
                    page.check("#action-toggle")
                    page.click("#release-selected")
                    page.wait_for_selector("text=Are you sure?")
                    page.click("input[type=submit][value^='Yes']")
                    page.wait_for_url("**/lock/?q=shop.product&backend=default")
                    assert "Released 2 locks" in page.inner_text(".messagelist")
                    assert page.input_value("#searchbar") == "shop.product"
                    assert rows.count() == 0
                    assert "No held lock matches." in page.inner_text("#result_list")
                finally:
                    browser.close()
            entries = LogEntry.objects.order_by("object_repr")
            assert [(e.action_flag, e.object_repr) for e in entries] == [
                (CHANGE, "shop.product:42"),
                (CHANGE, "shop.product:7"),
            ]
            assert (
                entries[0]
                .get_change_message()
                .startswith(
                    "Force-released lock 'shop.product:42' on backend 'default' "
                )
            )
        finally:
            for handle in handles:
                try:
                    handle.release()
                except LockLost:
                    pass
