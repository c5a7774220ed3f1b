"""A command class of a user's own that runs under a lock (LockedCommand)."""

import time

from django_distlock.management.run import LockedCommand


class Command(LockedCommand):
    help = "Test job under its own lock."
    lock_name = "locked-job"
    lock_ttl = 1.0

    def add_arguments(self, parser):
        parser.add_argument("--sleep", type=float, default=0.0)

    def handle(self, *args, sleep, **options):
        time.sleep(sleep)
        self.stdout.write("locked job ran")
