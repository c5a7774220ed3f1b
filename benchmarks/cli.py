"""``python -m benchmarks``: start the servers, run the scenarios, write the report."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import pickle
import platform
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from .servers import PostgresDatabase, RedisServer

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ["uncontended", "contended", "redlock", "database", "kinds", "scale"]
REDLOCK_NODES = 5
#: Our own database (the pid keeps a smoke run apart from a full run).
PG_NAME = f"distlock_bench_{os.getpid()}"


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


@dataclass
class Context:
    """What every scenario needs to know about this run."""

    quick: bool
    redis_url: str = ""
    redlock_urls: list[str] = field(default_factory=list)
    pg: PostgresDatabase | None = None
    root: Path = ROOT
    has_database_backend: bool = False
    has_redlock_backend: bool = False
    has_locks_command: bool = False
    has_admin: bool = False
    current: str = ""
    started: float = field(default_factory=time.monotonic)

    def size(self, *, full, quick):
        """Return the full-run or the quick-run value of a parameter."""
        return quick if self.quick else full

    def progress(self, message: str) -> None:
        elapsed = time.monotonic() - self.started
        print(f"  [{elapsed:6.1f} s] {self.current}: {message}", file=sys.stderr)


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Compare django_distlock with its peers, alternating "
        "contenders in one run; print a markdown table and write plots.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: a few hundred cycles, small counts (numbers are "
        "not meaningful); writes to benchmarks/results/raw/quick unless --out",
    )
    parser.add_argument(
        "--only",
        default=",".join(SCENARIOS),
        help=f"comma-separated scenarios to run (default: all of {SCENARIOS})",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="directory for the report and plots (default: benchmarks/results "
        "and docs/img for a full run)",
    )
    parser.add_argument(
        "--replot",
        type=Path,
        metavar="PICKLE",
        help="only re-render the report and plots of an earlier run's raw "
        "results (its latest.pickle)",
    )
    parser.add_argument(
        "--no-postgres", action="store_true", help="skip the PostgreSQL scenario"
    )
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    selected = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(selected) - set(SCENARIOS)
    if unknown:
        print(f"unknown scenarios: {sorted(unknown)}", file=sys.stderr)
        return 2
    if args.out:
        report_path = args.out / "latest.md"
        img_dir = raw_dir = args.out
    elif args.quick:
        report_path = ROOT / "benchmarks/results/raw/quick/latest.md"
        img_dir = raw_dir = report_path.parent
    else:
        report_path = ROOT / "benchmarks/results/latest.md"
        img_dir = ROOT / "docs/img"
        raw_dir = ROOT / "benchmarks/results/raw"
    publish = not (args.out or args.quick)
    if args.replot:
        with open(args.replot, "rb") as f:
            saved = pickle.load(f)
        return write_outputs(saved, report_path, img_dir, None, publish)

    ctx = Context(quick=args.quick)
    ctx.has_redlock_backend = has_module("django_distlock.backends.redlock")
    ctx.has_database_backend = has_module("django_distlock.backends.database")
    ctx.has_locks_command = has_module("django_distlock.management.commands.locks")
    sqlite_path = os.path.join(
        tempfile.gettempdir(), f"distlock-bench-{os.getpid()}.sqlite3"
    )
    servers: list[RedisServer] = []
    results: dict = {}
    errors: dict[str, str] = {}
    skipped: dict[str, str] = {}
    meta: dict = {}
    try:
        servers.append(RedisServer().start())
        ctx.redis_url = servers[0].url
        if "redlock" in selected:
            for _ in range(REDLOCK_NODES):
                servers.append(RedisServer().start())
            ctx.redlock_urls = [s.url for s in servers[1:]]
        if not args.no_postgres and PostgresDatabase.available():
            ctx.pg = PostgresDatabase(PG_NAME).create()
        os.environ["DISTLOCK_BENCH_REDIS"] = ctx.redis_url
        os.environ["DISTLOCK_BENCH_REDLOCK"] = ",".join(ctx.redlock_urls)
        os.environ["DISTLOCK_BENCH_PG"] = ctx.pg.name if ctx.pg else ""
        os.environ["DISTLOCK_BENCH_SQLITE"] = sqlite_path
        os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
        setup_django(ctx)
        meta = collect_meta(ctx, servers[0])
        for name in selected:
            reason = skip_reason(ctx, name)
            if reason:
                skipped[name] = reason
                print(f"- {name}: skipped ({reason})", file=sys.stderr)
                continue
            ctx.current = name
            print(f"- {name}", file=sys.stderr)
            module = importlib.import_module(f"benchmarks.{name}")
            try:
                results[name] = module.run(ctx)
            except Exception:
                errors[name] = traceback.format_exc()
                print(errors[name], file=sys.stderr)
    finally:
        for server in servers:
            server.stop()
        if ctx.pg is not None:
            from django.db import connections

            connections.close_all()
            ctx.pg.drop()
        if os.path.exists(sqlite_path):
            os.unlink(sqlite_path)
    meta["load_end"] = os.getloadavg()
    meta["duration_s"] = time.monotonic() - ctx.started
    saved = {
        "results": results,
        "skipped": skipped,
        "errors": errors,
        "meta": meta,
    }
    return write_outputs(saved, report_path, img_dir, raw_dir, publish)


def write_outputs(saved, report_path, img_dir, raw_dir, publish) -> int:
    """Write the report, the plots and (``raw_dir``) the raw results."""
    from . import plots, report

    if raw_dir is not None:
        raw_dir.mkdir(parents=True, exist_ok=True)
        with open(raw_dir / "latest.pickle", "wb") as f:
            pickle.dump(saved, f)
    if publish:
        prefix = os.path.relpath(img_dir, report_path.parent) + "/"
    else:
        prefix = ""
    text = report.render(**saved, image_prefix=prefix)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(text)
    print(text)
    img_dir.mkdir(parents=True, exist_ok=True)
    written = plots.write_all(saved["results"], img_dir)
    print(f"report: {report_path}", file=sys.stderr)
    for path in written:
        print(f"plot: {path}", file=sys.stderr)
    if publish:
        page = ROOT / "docs/performance.md"
        if report.publish(report.render(**saved, image_prefix="img/"), page):
            print(f"results copied into {page}", file=sys.stderr)
    return 1 if saved["errors"] else 0


def skip_reason(ctx: Context, name: str) -> str:
    if name == "redlock" and not ctx.has_redlock_backend:
        return "django_distlock.backends.redlock does not exist yet"
    if name == "database" and ctx.pg is None:
        return "PostgreSQL is not reachable (or --no-postgres)"
    return ""


def setup_django(ctx: Context) -> None:
    from .common import quiet_imports

    quiet_imports()
    import django
    from django.core.management import call_command

    django.setup()
    from django.conf import settings

    for alias in settings.DATABASES:
        call_command("migrate", verbosity=0, interactive=False, database=alias)
    if has_module("django_distlock.admin"):
        from django.urls import NoReverseMatch, reverse

        try:
            reverse("admin:django_distlock_lock_changelist")
            ctx.has_admin = True
        except NoReverseMatch:
            ctx.has_admin = False


def collect_meta(ctx: Context, redis_server: RedisServer) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for dist in (
        "Django",
        "redis",
        "hiredis",
        "python-redis-lock",
        "pottery",
        "django-redis",
        "django-pglocks",
        "django-db-mutex",
        "psycopg",
    ):
        try:
            versions[dist] = version(dist)
        except PackageNotFoundError:
            versions[dist] = "-"
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "quick": ctx.quick,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_start": os.getloadavg(),
        "redis_server": redis_server.version(),
        "postgres": ctx.pg.version() if ctx.pg else "-",
        "versions": versions,
    }
