"""The Redis keys of one lock, and the Lua scripts of the Redis backends."""

from __future__ import annotations

import math

from ...keys import encode_name, name_digest
from ..scripts import load_script

__all__ = ["ACQUIRE", "CANCEL", "EXTEND", "RELEASE", "LockKeys", "ms"]

_HERE = __name__.rpartition(".")[0]
ACQUIRE = load_script(_HERE, "acquire")
RELEASE = load_script(_HERE, "release")
EXTEND = load_script(_HERE, "extend")
CANCEL = load_script(_HERE, "cancel")
LIST = load_script(_HERE, "list")
R_ACQUIRE = load_script(_HERE, "reentrant_acquire")
R_RELEASE = load_script(_HERE, "reentrant_release")
R_EXTEND = load_script(_HERE, "reentrant_extend")
R_ADOPT = load_script(_HERE, "reentrant_adopt")

#: The lease hash's fields, in the order a listing reads them.
LEASE_FIELDS = ("t", "f", "n", "h", "p", "th", "a")


class LockKeys:
    """The Redis keys of one lock name (all in one cluster hash slot)."""

    __slots__ = (
        "lease",
        "queue",
        "records",
        "wake_prefix",
        "triple",
        "stored_name",
        "busy",
    )

    def __init__(self, prefix: str, name: str):
        #: The name as the lease hash stores it (kept with the cached keys).
        self.stored_name = encode_name(name)
        self.lease = f"{prefix}:{{{name_digest(name)}}}"
        self.queue = self.lease + ":q"
        self.records = self.lease + ":r"
        self.wake_prefix = self.lease + ":w:"
        #: The lease, queue and records keys (most scripts take these).
        self.triple = (self.lease, self.queue, self.records)
        #: True while this process's last attempt found the name taken.
        self.busy = False


def ms(seconds: float) -> int:
    """Return ``seconds`` as whole milliseconds, rounded up, at least 1."""
    whole = math.ceil(seconds * 1000)
    return whole if whole > 1 else 1
