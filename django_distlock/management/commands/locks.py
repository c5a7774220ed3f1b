"""``manage.py locks``: list and clear the holders of every configured backend.

The command reports; the backends act (``holders``, ``force_release``,
``clear_stale``). Clearing removes exactly the lease that was listed: a lock
taken again in between keeps its new holder, and fencing counters are never
reset.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator

from django.core.management.base import BaseCommand, CommandError

from django_distlock.backends.base import BaseLockBackend, Holder
from django_distlock.exceptions import LockError
from django_distlock.handler import locks

#: Longest name shown in the table (the full name is in the JSON output).
TABLE_NAME_WIDTH = 60


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

    # -- helpers ------------------------------------------------------------

    def backends(self, using: str | None) -> list[BaseLockBackend]:
        aliases = list(locks.settings)
        if using is not None:
            if using not in aliases:
                raise CommandError(
                    f"Unknown LOCKS alias {using!r}; configured: {', '.join(aliases)}."
                )
            aliases = [using]
        return [locks[alias] for alias in aliases]

    def unreachable(self, backend: BaseLockBackend, exc: Exception) -> None:
        self.stderr.write(
            self.style.ERROR(f"Backend {backend.alias!r} could not be read: {exc}")
        )

    def holders(
        self, backends: Iterable[BaseLockBackend], prefix: str, failed: list
    ) -> Iterator[Holder]:
        """Yield the holders of each backend; record the ones that fail."""
        for backend in backends:
            try:
                yield from backend.holders(prefix)
            except (LockError, NotImplementedError, OSError) as exc:
                failed.append(backend.alias)
                self.unreachable(backend, exc)

    def handle(self, *args, **options):
        if options["subcommand"] == "list":
            return self.handle_list(**options)
        return self.handle_clear(**options)

    # -- list -----------------------------------------------------------------

    def handle_list(self, *, using, prefix, fmt, **options):
        backends = self.backends(using)
        failed: list[str] = []
        rows = self.holders(backends, prefix, failed)
        if fmt == "json":
            self.write_json(rows)
        else:
            self.write_table(rows)

    def write_json(self, rows: Iterable[Holder]) -> None:
        # Streamed in chunks: 100,000 holders need not sit in memory as one
        # string, nor cost 100,000 writes.
        out = self.stdout
        dumps = json.dumps
        chunk: list[str] = []
        first = True
        out.write("[", ending="")
        for holder in rows:
            chunk.append(("\n  " if first else ",\n  ") + dumps(holder.as_dict()))
            first = False
            if len(chunk) >= 1000:
                out.write("".join(chunk), ending="")
                chunk = []
        out.write("".join(chunk) + ("\n]" if not first else "]"))

    def write_table(self, rows: Iterable[Holder]) -> None:
        now = time.time()
        head = ("BACKEND", "NAME", "HOLDER", "ACQUIRED AT", "EXPIRES AT", "FENCE")
        lines = []
        for h in rows:
            expires = (
                f"{h.expires_at.isoformat(timespec='seconds')} "
                f"(in {h.expires_at.timestamp() - now:.1f}s)"
                if h.expires_at
                else "-"
            )
            lines.append(
                (
                    printable(h.backend),
                    printable(h.name, TABLE_NAME_WIDTH),
                    printable(h.holder),
                    h.acquired_at.isoformat(timespec="seconds")
                    if h.acquired_at
                    else "-",
                    expires,
                    "-" if h.fencing_token is None else str(h.fencing_token),
                )
            )
        if not lines:
            self.stdout.write("No locks are held.")
            return
        lines.sort(key=lambda r: (r[0], r[1]))
        widths = [max(len(r[i]) for r in [head, *lines]) for i in range(len(head))]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        self.stdout.write(fmt.format(*head).rstrip())
        for start in range(0, len(lines), 1000):
            self.stdout.write(
                "\n".join(fmt.format(*r).rstrip() for r in lines[start : start + 1000])
            )
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
            for backend in backends:
                try:
                    total += backend.clear_stale()
                except (LockError, OSError) as exc:
                    failed.append(backend.alias)
                    self.unreachable(backend, exc)
            self.stdout.write(self.style.SUCCESS(f"Cleared {total} stale lock(s)."))
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
            self.stdout.write("Cleared 0 locks: none of them is held.")
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
                results = backend.force_release_many(
                    [(h.name, h.token) for h in holders]
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
        self.stdout.write(self.style.SUCCESS(f"Cleared {cleared} lock(s){note}."))
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
                f"Could not reach backend(s) {', '.join(map(repr, failed))}."
            )


def _common_prefix(names: list[str]) -> str:
    first, last = min(names), max(names)
    i = 0
    while i < min(len(first), len(last)) and first[i] == last[i]:
        i += 1
    return first[:i]
