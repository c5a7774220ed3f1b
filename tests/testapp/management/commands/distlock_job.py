"""A management command for the ``locks run`` tests: records that it ran."""

import os
import sys
import time

from django.core.management.base import BaseCommand, CommandError

from django_distlock import locks


class Command(BaseCommand):
    help = "Test job: record a run, wait, exit as asked."

    def add_arguments(self, parser):
        parser.add_argument("--record", help="Append this process's pid to FILE.")
        parser.add_argument("--until", help="Run until FILE exists (60 s at most).")
        parser.add_argument("--sleep", type=float, default=0.0)
        parser.add_argument("--exit", type=int, default=0, dest="status")
        parser.add_argument("--error", type=int, help="Raise CommandError(returncode)")
        parser.add_argument("--say", default="", help="Write this to stdout.")
        parser.add_argument(
            "--check-held", help="Fail unless this lock name is listed as held."
        )

    def handle(self, *args, record, until, sleep, status, error, say, **options):
        if record:
            with open(record, "a") as f:
                f.write(f"{os.getpid()}\n")
        if say:
            self.stdout.write(say)
        if options["check_held"]:
            name = options["check_held"]
            if not any(h.name == name for h in locks["default"].holders(name)):
                raise CommandError(f"{name!r} is not held", returncode=4)
        deadline = time.monotonic() + 60
        while until and not os.path.exists(until) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(sleep)
        if error is not None:
            raise CommandError("the job failed", returncode=error)
        if status:
            sys.exit(status)
