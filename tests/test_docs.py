"""The documentation: the site builds with no warnings, and every snippet runs.

Every fenced ```python block of every ``docs/**/*.md`` page is executed, the
blocks of one page in order in one fresh namespace, against a real
redis-server (``LOCKS["default"]``) plus the other backends the pages use.
An HTML comment right before a block changes what happens to it (the full
convention is in ``docs/contributing.md``):

- ``<!-- test: skip -->``: compiled (so it cannot hold a syntax error) but not
  run; for snippets that cannot run standalone. Say why after ``skip``.
- ``<!-- test: settings -->``: run in a namespace of its own as a settings
  file; its ``LOCKS`` (with ``CACHES``, ``DEBUG`` and ``DISTLOCK_*``) is then
  validated by Django's system checks, which must report no ``distlock.*``
  message about settings.
  ``<!-- test: settings distlock.E011 distlock.W001 -->`` expects exactly those
  ids instead.
- ``<!-- test: run`` ... ``-->``: code hidden from the reader, run at that
  point of the page (imports, fixtures, assertions).
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import re
import subprocess
import sys
import textwrap
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

pytestmark = pytest.mark.redis

# -- extraction ---------------------------------------------------------------

FENCE_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
MARKER = re.compile(r"^[ \t]*<!--\s*test:\s*(?P<body>.*?)\s*(?P<close>-->)?\s*$")
RUNNABLE_LANGS = {"python", "py"}
CHECK_SETTINGS = {"LOCKS", "CACHES", "DEBUG"}


@dataclass
class Snippet:
    """One piece of code found on a page."""

    page: Path
    line: int  # 1-based line of the first code line
    code: str
    kind: str  # "run", "skip", "settings", "hidden"
    expect: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def compile(self, flags: int = 0) -> types.CodeType:
        # Pad so that tracebacks point at the line of the .md file.
        source = "\n" * (self.line - 1) + self.code
        return compile(
            source,
            str(self.page.relative_to(ROOT)),
            "exec",
            flags=flags | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
            dont_inherit=True,
        )


def extract(page: Path) -> list[Snippet]:
    """Return the snippets of ``page`` in order, markers applied."""
    lines = page.read_text(encoding="utf-8").splitlines()
    snippets: list[Snippet] = []
    pending: tuple[str, list[str]] | None = None  # marker awaiting its block
    i = 0
    while i < len(lines):
        line = lines[i]
        marker = MARKER.match(line)
        if marker:
            body = marker.group("body")
            words = body.split()
            verb = words[0] if words else ""
            if verb == "run":
                if marker.group("close"):
                    raise AssertionError(
                        f"{page}:{i + 1}: '<!-- test: run' takes its code on the "
                        "following lines, closed by '-->' on a line of its own."
                    )
                start = i + 1
                j = start
                while j < len(lines) and lines[j].strip() != "-->":
                    j += 1
                if j == len(lines):
                    raise AssertionError(f"{page}:{i + 1}: unclosed '<!-- test: run'.")
                code = textwrap.dedent("\n".join(lines[start:j])) + "\n"
                snippets.append(Snippet(page, start + 1, code, "hidden"))
                i = j + 1
                continue
            if not marker.group("close"):
                raise AssertionError(f"{page}:{i + 1}: a marker must fit on one line.")
            if verb not in {"skip", "settings"}:
                raise AssertionError(
                    f"{page}:{i + 1}: unknown marker 'test: {verb}' "
                    "(use skip, settings or run; see docs/contributing.md)."
                )
            pending = (verb, words[1:])
            i += 1
            continue
        opened = FENCE_OPEN.match(line)
        if opened:
            indent, fence = opened.group("indent"), opened.group("fence")
            info = opened.group("info").strip()
            lang = info.split()[0].lstrip(".{").rstrip("}") if info else ""
            start = i + 1
            j = start
            close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
            while j < len(lines) and not close.match(lines[j]):
                j += 1
            body = [
                ln[len(indent) :] if ln.startswith(indent) else ln
                for ln in lines[start:j]
            ]
            code = textwrap.dedent("\n".join(body)) + "\n"
            if lang in RUNNABLE_LANGS:
                kind, args = pending if pending else ("run", [])
                expect = list(args) if kind == "settings" else []
                snippets.append(Snippet(page, start + 1, code, kind, expect))
            elif pending:
                raise AssertionError(
                    f"{page}:{i + 1}: a 'test:' marker stands before a "
                    f"{lang or 'plain'} block; markers apply to python blocks only."
                )
            pending = None
            i = j + 1
            continue
        if pending and line.strip():
            raise AssertionError(
                f"{page}:{i + 1}: a 'test:' marker must stand right before its block."
            )
        i += 1
    return snippets


def all_pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def page_id(page: Path) -> str:
    return str(page.relative_to(DOCS))


# -- running ------------------------------------------------------------------


def run_code(snippet: Snippet, namespace: dict) -> None:
    code = snippet.compile()
    if code.co_flags & inspect.CO_COROUTINE:
        # Top-level await, as in `python -m asyncio`: run it on a fresh loop.
        asyncio.run(types.FunctionType(code, namespace)())
    else:
        exec(code, namespace)


def check_settings(snippet: Snippet) -> None:
    from django.core import checks
    from django.test import override_settings

    namespace: dict = {"__name__": "settings"}
    run_code(snippet, namespace)
    overrides = {
        k: v
        for k, v in namespace.items()
        if k in CHECK_SETTINGS or k.startswith("DISTLOCK_")
    }
    assert overrides, f"{snippet.where}: a settings snippet sets nothing checked."
    # A settings file without LOCKS gets the default, not the pages' LOCKS.
    overrides.setdefault("LOCKS", None)
    with override_settings(**overrides):
        # Messages about settings only: the URL check (distlock.E020) judges
        # the test project's views, not the snippet.
        messages = [
            m
            for m in checks.run_checks()
            if (m.id or "").startswith("distlock.")
            and str(m.obj).startswith("settings.")
        ]
    found = sorted({m.id for m in messages})
    expected = sorted(set(snippet.expect))
    assert found == expected, (
        f"{snippet.where}: system checks reported {found}, the page expects "
        f"{expected}:\n" + "\n".join(str(m) for m in messages)
    )


def importable(path: str) -> bool:
    from django.utils.module_loading import import_string

    try:
        import_string(path)
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def quorum_servers():
    """Three more redis-servers, for pages that use the Redlock alias."""
    from .servers import RedisServer

    servers = [RedisServer().start() for _ in range(3)]
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture
def docs_locks(redis_server, quorum_servers):
    """The LOCKS the pages run under: Redis default plus the other backends."""
    from django.test import override_settings

    for server in [redis_server, *quorum_servers]:
        server.client().flushall()
    url = redis_server.url
    locks = {
        "default": {
            "BACKEND": "django_distlock.backends.redis.RedisLockBackend",
            "LOCATION": url,
        },
        "nested": {
            "BACKEND": "django_distlock.backends.redis.ReentrantRedisLockBackend",
            "LOCATION": url,
            # Its own names: listings of "default" and "nested" stay apart.
            "KEY_PREFIX": "nested",
        },
        "locmem": {"BACKEND": "django_distlock.backends.locmem.LocMemLockBackend"},
    }
    database = "django_distlock.backends.database.DatabaseLockBackend"
    if importable(database):
        locks["db"] = {"BACKEND": database, "OPTIONS": {"DATABASE": "default"}}
    redlock = "django_distlock.backends.redlock.RedlockBackend"
    if importable(redlock):
        locks["quorum"] = {
            "BACKEND": redlock,
            "LOCATION": [s.url for s in quorum_servers],
        }
    # The migration page compares with django-redis's cache.lock().
    caches = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url}}
    with override_settings(LOCKS=locks, CACHES=caches, REDIS_URL=url):
        yield locks


SNIPPET_PAGES = [p for p in all_pages() if extract(p)]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("page", SNIPPET_PAGES, ids=page_id)
def test_page_snippets(page, docs_locks):
    """Run the page's snippets in order in one namespace."""
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    for snippet in extract(page):
        if snippet.kind == "skip":
            snippet.compile()
        elif snippet.kind == "settings":
            check_settings(snippet)
        else:
            run_code(snippet, namespace)


# -- the harness itself -------------------------------------------------------


def test_extract_conventions(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        textwrap.dedent(
            """\
            # Title

            ```python
            a = 1
            ```

            <!-- test: skip needs a request -->
            ```python
            view(request)
            ```

            <!-- test: settings distlock.E011 -->
            ```python title="settings.py"
            LOCKS = {}
            ```

            <!-- test: run
            assert a == 1
            -->

            !!! note
                ```python
                b = 2
                ```

            ```console
            $ python manage.py locks list
            ```
            """
        )
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        found = extract(page)
    finally:
        ROOT = saved
    assert [(s.kind, s.line, s.code, s.expect) for s in found] == [
        ("run", 4, "a = 1\n", []),
        ("skip", 9, "view(request)\n", []),
        ("settings", 14, "LOCKS = {}\n", ["distlock.E011"]),
        ("hidden", 18, "assert a == 1\n", []),
        ("run", 23, "b = 2\n", []),
    ]


def test_marker_must_precede_a_python_block(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- test: skip -->\nsome prose\n```python\nx\n```\n")
    with pytest.raises(AssertionError, match="right before"):
        extract(page)


def test_every_page_is_in_the_nav():
    import yaml

    def files(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, list):
            for item in node:
                yield from files(item)
        elif isinstance(node, dict):
            for value in node.values():
                yield from files(value)

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    in_nav = set(files(config["nav"]))
    on_disk = {page_id(p) for p in all_pages()}
    assert on_disk - in_nav == set(), "pages missing from the nav in mkdocs.yml"


def test_readme_links_to_the_docs():
    readme = (ROOT / "README.md").read_text()
    assert readme.startswith("# django_distlock\n\n```sh\nscripts/demo")
    assert "(docs/index.md)" in readme
    assert "mkdocs" in readme


def test_site_builds_without_warnings(tmp_path):
    """``mkdocs build --strict``: any warning (a broken link, a bad docstring
    reference, a page missing from the nav) fails the build."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "NO_COLOR": "1", "NO_MKDOCS_2_WARNING": "1"},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "WARNING" not in output, output
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "api" / "index.html").exists()
    # A marker must stay an invisible comment: inside an indented block (an
    # admonition, a tab) Markdown may print a multi-line one as text.
    for html in (tmp_path / "site").rglob("*.html"):
        text = re.sub(r"<(pre|code)\b.*?</\1>", "", html.read_text(), flags=re.S)
        assert "&lt;!-- test:" not in text, f"a test marker is visible in {html}"


def test_every_check_id_is_documented():
    """The check ids table of docs/settings.md lists every id the code emits."""
    emitted = set()
    for path in (ROOT / "django_distlock").rglob("*.py"):
        emitted |= set(re.findall(r"\bdistlock\.[EW]\d{3}\b", path.read_text()))
    table = (DOCS / "settings.md").read_text()
    documented = set(re.findall(r"^\| `(distlock\.[EW]\d{3})` \|", table, re.M))
    assert emitted - documented == set(), "check ids missing from docs/settings.md"
    assert documented - emitted == set(), "docs/settings.md lists unknown check ids"


def test_usage_argument_table_lists_every_keyword():
    """Each keyword of lock(), lock_for() and distributed_lock() has its row
    in the usage guide's table (on_locked has a section of its own)."""
    from django_distlock import distributed_lock, lock, lock_for

    page = (DOCS / "usage.md").read_text()
    rows = set(re.findall(r"^\| `(\w+)` \|", page, re.M))
    keywords = {
        name
        for function in (lock, lock_for, distributed_lock)
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.kind in (parameter.KEYWORD_ONLY,)
    } - {"on_locked", "options"}
    assert keywords <= rows, sorted(keywords - rows)
