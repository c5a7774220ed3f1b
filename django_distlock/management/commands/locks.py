"""``manage.py locks``: list and clear the holders of every configured backend.

The command reports; the backends act (``holders``, ``force_release``,
``clear_stale``). Clearing removes exactly the lease that was listed: a lock
taken again in between keeps its new holder, and fencing counters are never
reset.

The table's KIND column says ``exclusive``, ``shared``, or ``permit k of N``
for a semaphore permit: the k-th oldest live permit of that name (by
acquisition time) of a semaphore of N. ``clear NAME`` clears every holder
listed under NAME: all shared holders of the lock, and every permit of the
semaphore of the same name.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Iterable, Iterator
from operator import itemgetter

from django.core.management.base import BaseCommand, CommandError

from django_distlock.backends.base import BaseLockBackend, Holder
from django_distlock.backends.holders import visible_name
from django_distlock.exceptions import LockError
from django_distlock.handler import locks
from django_distlock.management import selected_aliases
from django_distlock.management.ping import add_ping_parser, handle_ping
from django_distlock.management.run import add_run_parser, handle_run

#: Longest name shown in the table (the full name is in the JSON output).
TABLE_NAME_WIDTH = 60
#: Lines of output written at once.
CHUNK = 5000


def printable(text: str, width: int | None = None) -> str:
    """Return ``text`` with control characters escaped, cut to ``width``."""
    if width is not None and len(text) > width:
        text = text[: width - 1] + "…"
    if text.isprintable():
        return text
    return "".join(
        c
        if c.isprintable()
        else c.encode("unicode_escape", "backslashreplace").decode()
        for c in text
    )


class Command(BaseCommand):
    help = "List or clear the active holders of distributed locks."
    # Only the checks of LOCKS: the command needs nothing else, and the full
    # set (URLs, admin, caches, models) would double its start-up time.
    requires_system_checks = ["distlock"]

    def add_arguments(self, parser):
        sub = parser.add_subparsers(
            dest="subcommand", title="subcommands", required=True
        )

        list_parser = sub.add_parser("list", help="List active holders.")
        list_parser.add_argument(
            "--using", help="Only this LOCKS alias (default: every alias)."
        )
        list_parser.add_argument(
            "--prefix",
            default="",
            help="Only locks whose name starts with this literal text.",
        )
        list_parser.add_argument(
            "--format", choices=["table", "json"], default="table", dest="fmt"
        )

        clear_parser = sub.add_parser(
            "clear", help="Force-release locks (by name, prefix, stale or all)."
        )
        clear_parser.add_argument("names", nargs="*", metavar="NAME")
        clear_parser.add_argument(
            "--prefix", help="Clear every lock whose name starts with this text."
        )
        clear_parser.add_argument(
            "--stale",
            action="store_true",
            help="Remove only expired or orphaned records, never a live lease.",
        )
        clear_parser.add_argument(
            "--all", action="store_true", dest="all_", help="Clear every held lock."
        )
        clear_parser.add_argument(
            "--using", help="Only this LOCKS alias (default: every alias)."
        )
        clear_parser.add_argument(
            "--noinput",
            "--no-input",
            action="store_false",
            dest="interactive",
            help="Do not ask for confirmation.",
        )
        add_run_parser(sub)
        add_ping_parser(sub)

    # -- helpers ------------------------------------------------------------

    def backends(self, using: str | None) -> list[BaseLockBackend]:
        return [locks[alias] for alias in selected_aliases(using)]

    def unreachable(self, backend: BaseLockBackend, exc: Exception) -> None:
        # One line per backend: scripts read stderr line by line.
        reason = " ".join(str(exc).split()) or type(exc).__name__
        self.stderr.write(
            self.style.ERROR(f"Backend {backend.alias!r} could not be read: {reason}")
        )

    def holders(
        self, backends: Iterable[BaseLockBackend], prefix: str, failed: list
    ) -> Iterator[Holder]:
        """Yield the holders of each backend; record the ones that fail."""
        self.read_aliases: list[str] = []
        for backend in backends:
            try:
                yield from backend.holders(prefix)
            except (LockError, NotImplementedError, OSError) as exc:
                failed.append(backend.alias)
                self.unreachable(backend, exc)
            else:
                self.read_aliases.append(backend.alias)

    def handle(self, *args, **options):
        self.read_aliases = []
        if options["subcommand"] == "list":
            return self.handle_list(**options)
        if options["subcommand"] == "run":
            return handle_run(self, **options)
        if options["subcommand"] == "ping":
            return handle_ping(self, **options)
        return self.handle_clear(**options)

    # -- list -----------------------------------------------------------------

    def handle_list(self, *, using, prefix, fmt, **options):
        backends = self.backends(using)
        failed: list[str] = []
        rows = self.holders(backends, prefix, failed)
        # A listing allocates a few objects per lease and frees few until it
        # ends: the cyclic garbage collector would scan them again and again
        # (10-15% of the time at 100,000 leases), for cycles it cannot find.
        collecting = gc.isenabled()
        gc.disable()
        try:
            if fmt == "json":
                self.write_json(rows)
            else:
                self.write_table(rows, failed)
        finally:
            if collecting:
                gc.enable()
        if failed:
            # Like ``migrate --check``: the output stands, the status says it
            # is incomplete (the stderr lines above name each backend).
            sys.exit(1)

    def write_json(self, rows: Iterable[Holder]) -> None:
        # Streamed in chunks: 100,000 holders need not sit in memory as one
        # string, nor cost 100,000 writes.
        out = self.stdout
        lead = "[\n  "
        chunk: list[str] = []
        for holder in rows:
            chunk.append(holder.as_json())
            if len(chunk) >= CHUNK:
                out.write(lead + ",\n  ".join(chunk), ending="")
                lead = ",\n  "
                chunk = []
        if chunk:
            out.write(lead + ",\n  ".join(chunk) + "\n]")
        else:
            out.write("[]" if lead == "[\n  " else "\n]")

    def write_table(self, rows: Iterable[Holder], failed: list[str]) -> None:
        now = time.time()
        head = (
            "BACKEND",
            "NAME",
            "KIND",
            "HOLDER",
            "ACQUIRED AT",
            "EXPIRES AT",
            "FENCE",
        )
        width = TABLE_NAME_WIDTH
        aliases: dict[str, str] = {}
        holders: dict[tuple, str] = {}  # a few processes hold most leases
        permits: dict[tuple, list] = {}  # (alias, name) -> [(acquired, i, limit)]
        lines = []
        append = lines.append
        for h in rows:
            backend = aliases.get(h.backend)
            if backend is None:
                backend = aliases[h.backend] = printable(h.backend)
            name = h.name
            if len(name) > width or not name.isprintable():
                name = printable(name, width)
            name = visible_name(name)
            identity = (h.host, h.pid, h.thread)
            holder = holders.get(identity)
            if holder is None:
                holder = h.holder
                if not holder.isprintable():
                    holder = printable(holder)
                holders[identity] = holder
            acquired, expires = h.isoformat(timespec="seconds")
            if expires is not None:
                expires = f"{expires} (in {h.expires_ts - now:.1f}s)"
            fence = h.fencing_token
            kind = h.kind.mode
            if kind == "permit":
                permits.setdefault((h.backend, h.name), []).append(
                    (h.acquired_ts or 0.0, fence or 0, len(lines), h.kind.limit)
                )
            append(
                (
                    backend,
                    name,
                    kind,
                    holder,
                    acquired or "-",
                    expires or "-",
                    "-" if fence is None else str(fence),
                )
            )
        for found in permits.values():
            found.sort()
            for rank, (_, _, i, limit) in enumerate(found, 1):
                row = lines[i]
                lines[i] = (*row[:2], f"permit {rank} of {limit}", *row[3:])
        if not lines:
            if not failed:
                self.stdout.write("No locks are held.")
            elif self.read_aliases:
                self.stdout.write(
                    f"No locks are held on {_aliases(self.read_aliases)}; "
                    f"{_aliases(failed)} could not be read."
                )
            return
        # Measured before sorting, while the rows are still in memory order;
        # the backend and holder columns from their few distinct values, and
        # not the last column (digits or "-"): it is not padded, so no line
        # ends in spaces.
        distinct = {0: aliases.values(), 3: holders.values()}
        widths = [
            max(
                len(head[i]),
                max(map(len, distinct.get(i) or map(itemgetter(i), lines))),
            )
            for i in range(len(head) - 1)
        ]
        # By backend, then name: two stable sorts on plain strings are
        # several times faster than one on (backend, name) tuples.
        lines.sort(key=itemgetter(1))
        if len(aliases) > 1:
            lines.sort(key=itemgetter(0))
        fmt = "  ".join(f"%-{w}s" for w in widths) + "  %s"
        self.stdout.write(fmt % head)
        for start in range(0, len(lines), CHUNK):
            self.stdout.write(
                "\n".join([fmt % r for r in lines[start : start + CHUNK]])
            )
        if failed:
            self.stdout.write(
                f"{len(lines)} lock(s) held on {_aliases(self.read_aliases)}; "
                f"{_aliases(failed)} could not be read."
            )
        else:
            self.stdout.write(f"{len(lines)} lock(s) held.")

    # -- clear ----------------------------------------------------------------

    def handle_clear(
        self, *, names, prefix, stale, all_, using, interactive, **options
    ):
        chosen = [bool(names), prefix is not None, stale, all_]
        if sum(chosen) != 1:
            raise CommandError(
                "Say what to clear: lock NAMEs, or exactly one of --prefix, "
                "--stale and --all."
            )
        backends = self.backends(using)
        where = f"backend {using!r}" if using else "every backend"
        if stale:
            if interactive and not self.confirm(
                f"Remove expired or orphaned lock records on {where}?"
            ):
                raise CommandError("Nothing cleared.")
            total = 0
            failed = []
            read = []
            for backend in backends:
                try:
                    total += backend.clear_stale()
                except (LockError, OSError) as exc:
                    failed.append(backend.alias)
                    self.unreachable(backend, exc)
                else:
                    read.append(backend.alias)
            where = f" on {_aliases(read)}" if failed and read else ""
            if read:
                self.stdout.write(
                    self.style.SUCCESS(f"Cleared {total} stale lock(s){where}.")
                )
            self.fail_if(failed)
            return

        failed: list[str] = []
        if names:
            wanted = set(names)
            common = _common_prefix(names)
            targets = [
                h for h in self.holders(backends, common, failed) if h.name in wanted
            ]
        else:
            targets = list(self.holders(backends, prefix or "", failed))
        if not targets:
            if not failed:
                self.stdout.write("Cleared 0 locks: none of them is held.")
            elif self.read_aliases:
                self.stdout.write(
                    f"Cleared 0 locks: none of them is held on "
                    f"{_aliases(self.read_aliases)}."
                )
            self.fail_if(failed)
            return
        if interactive:
            shown = ", ".join(repr(printable(h.name, 40)) for h in targets[:5])
            more = f" and {len(targets) - 5} more" if len(targets) > 5 else ""
            if not self.confirm(
                f"Force-release {len(targets)} lock(s) on {where} ({shown}{more})? "
                "Their holders will find them lost."
            ):
                raise CommandError("Nothing cleared.")
        by_backend: dict[str, list[Holder]] = {}
        for holder in targets:
            by_backend.setdefault(holder.backend, []).append(holder)
        cleared = gone = 0
        for alias, holders in by_backend.items():
            backend = locks[alias]
            try:
                # The kind only where it matters: a backend offering
                # exclusive locks alone may take (name, token) pairs only.
                results = backend.force_release_many(
                    [
                        (h.name, h.token)
                        if h.kind.mode == "exclusive"
                        else (h.name, h.token, h.kind)
                        for h in holders
                    ]
                )
            except (LockError, OSError) as exc:
                if alias not in failed:
                    failed.append(alias)
                    self.unreachable(backend, exc)
                continue
            cleared += sum(results)
            gone += len(results) - sum(results)
        note = (
            f" ({gone} had been released or taken again meanwhile and were left)"
            if gone
            else ""
        )
        read = [alias for alias in self.read_aliases if alias not in failed]
        where = f" on {_aliases(read)}" if failed and read else ""
        self.stdout.write(
            self.style.SUCCESS(f"Cleared {cleared} lock(s){where}{note}.")
        )
        self.fail_if(failed)

    def confirm(self, question: str) -> bool:
        try:
            answer = input(f"{question}\nType 'yes' to continue, or 'no' to cancel: ")
        except EOFError:
            raise CommandError(
                "No confirmation on stdin: pass --noinput to clear without asking."
            ) from None
        return answer.strip().lower() == "yes"

    def fail_if(self, failed: list[str]) -> None:
        if failed:
            raise CommandError(
                f"Could not reach backend(s) {', '.join(map(repr, failed))}: "
                "their locks were not read, nor cleared."
            )


def _aliases(aliases: list[str]) -> str:
    """Return ``backend 'a'`` or ``backends 'a', 'b'``, for a sentence."""
    if len(aliases) == 1:
        return f"backend {aliases[0]!r}"
    return f"backends {', '.join(map(repr, aliases))}"


def _common_prefix(names: list[str]) -> str:
    first, last = min(names), max(names)
    i = 0
    while i < min(len(first), len(last)) and first[i] == last[i]:
        i += 1
    return first[:i]
