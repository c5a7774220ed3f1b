"""What a listing says about one holder of a lock: :class:`Holder`.

Backends build Holders from what they store (``Holder.from_ms`` takes the
epoch-millisecond times most of them keep); ``manage.py locks`` and the admin
format them through the public properties and :meth:`Holder.as_dict` /
:meth:`Holder.as_json`.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from operator import attrgetter
from typing import Any

from .kinds import EXCLUSIVE, Kind

__all__ = ["Holder", "visible_name"]


#: The instant a Holder's epoch-millisecond times count from.
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
#: ``datetime.isoformat()`` of a UTC instant is "<second><fraction>+00:00";
#: the millisecond fractions, and a small memo of the seconds (the holders of
#: one listing were mostly taken within a few seconds of each other).
_ISO_FRACTIONS = ("+00:00", *(f".{ms:03d}000+00:00" for ms in range(1, 1000)))
_ISO_SECONDS: dict[int, str] = {}
_ISO_SECONDS_MAX = 4096


def visible_name(shown: str) -> str:
    """Return ``shown`` (a name, escaped or cut for display) so that it shows.

    An empty name, or one that begins or ends with whitespace, is put in
    double quotes: a table's columns or a page would otherwise show nothing,
    or lose the spaces.
    """
    if not shown or shown[0].isspace() or shown[-1].isspace():
        return f'"{shown}"'
    return shown


def _iso_second(second: int) -> str:
    """Return the ``isoformat()`` of a whole second, without its UTC offset."""
    text = _ISO_SECONDS.get(second)
    if text is None:
        if len(_ISO_SECONDS) >= _ISO_SECONDS_MAX:
            _ISO_SECONDS.clear()
        text = (_EPOCH + timedelta(seconds=second)).isoformat()[:-6]
        _ISO_SECONDS[second] = text
    return text


def _isoformat(value: datetime | int | None, timespec: str) -> str | None:
    """Return ``value`` (a datetime or epoch milliseconds) as ISO 8601."""
    if value is None:
        return None
    if type(value) is not int:
        return value.isoformat(timespec=timespec)
    second, ms = divmod(value, 1000)
    if timespec == "auto":
        return _iso_second(second) + _ISO_FRACTIONS[ms]
    if timespec == "seconds":
        return _iso_second(second) + "+00:00"
    return (_EPOCH + timedelta(milliseconds=value)).isoformat(timespec=timespec)


def _as_datetime(value: datetime | int | None) -> datetime | None:
    if type(value) is not int:
        return value
    return _EPOCH + timedelta(milliseconds=value)


def _as_timestamp(value: datetime | int | None) -> float | None:
    if value is None:
        return None
    if type(value) is not int:
        return value.timestamp()
    return value / 1000


_encode = json.encoder.encode_basestring_ascii


class Holder:
    """An active holder as a backend lists it (command, admin page).

    Immutable and compared by value, like a frozen dataclass of the fields
    ``backend``, ``name``, ``token``, ``host``, ``pid``, ``thread``,
    ``acquired_at``, ``expires_at`` (aware UTC datetimes, or None),
    ``fencing_token`` and ``kind`` (exclusive, shared, or a permit of a
    semaphore).

    A listing builds holders by the hundred thousand, so they are cheap to
    make: plain slots behind read-only properties, and a backend that reads
    its times as epoch milliseconds builds them with :meth:`from_ms`, which
    makes the datetimes only when they are asked for (a listing that prints
    them uses :meth:`isoformat`, which needs none).
    """

    __slots__ = (
        "_backend",
        "_name",
        "_token",
        "_host",
        "_pid",
        "_thread",
        "_acquired",
        "_expires",
        "_fencing_token",
        "_kind",
    )

    def __init__(
        self,
        backend: str,
        name: str,
        token: str,
        host: str = "",
        pid: int | None = None,
        thread: str = "",
        acquired_at: datetime | None = None,
        expires_at: datetime | None = None,
        fencing_token: int | None = None,
        kind: Kind = EXCLUSIVE,
    ):
        self._backend = backend
        self._name = name
        self._token = token
        self._host = host
        self._pid = pid
        self._thread = thread
        self._acquired = acquired_at
        self._expires = expires_at
        self._fencing_token = fencing_token
        self._kind = kind

    @classmethod
    def from_ms(
        cls,
        backend: str,
        name: str,
        token: str,
        host: str,
        pid: int | None,
        thread: str,
        acquired_ms: int | None,
        expires_ms: int | None,
        fencing_token: int | None,
        kind: Kind = EXCLUSIVE,
    ) -> Holder:
        """Return a holder whose times are given in epoch milliseconds (UTC)."""
        self = cls(
            backend, name, token, host, pid, thread, None, None, fencing_token, kind
        )
        # Kept as numbers; the datetimes are built only if they are read.
        self._acquired = acquired_ms
        self._expires = expires_ms
        return self

    backend = property(attrgetter("_backend"), doc="The LOCKS alias.")
    name = property(attrgetter("_name"), doc="The lock name, in full.")
    token = property(attrgetter("_token"), doc="The lease's token.")
    host = property(attrgetter("_host"), doc="The holder's host name.")
    pid = property(attrgetter("_pid"), doc="The holder's process id.")
    thread = property(attrgetter("_thread"), doc="The holder's thread (/task).")
    fencing_token = property(attrgetter("_fencing_token"), doc="The lease's fence.")
    kind = property(attrgetter("_kind"), doc="The lease's Kind.")

    @property
    def acquired_at(self) -> datetime | None:
        """When the lease was taken (aware, UTC), or None if unknown."""
        return _as_datetime(self._acquired)

    @property
    def expires_at(self) -> datetime | None:
        """When the lease expires unless renewed (aware, UTC), or None."""
        return _as_datetime(self._expires)

    @property
    def acquired_ts(self) -> float | None:
        """``acquired_at`` as a POSIX timestamp, or None."""
        return _as_timestamp(self._acquired)

    @property
    def expires_ts(self) -> float | None:
        """``expires_at`` as a POSIX timestamp, or None."""
        expires = self._expires
        if type(expires) is int:
            return expires / 1000
        return _as_timestamp(expires)

    @property
    def holder(self) -> str:
        """Return ``host:pid/thread`` for display."""
        return f"{self._host}:{self._pid}/{self._thread}"

    def isoformat(self, timespec: str = "auto") -> tuple[str | None, str | None]:
        """Return ``(acquired_at, expires_at)`` as ``datetime.isoformat`` does.

        None stands for an unknown time.
        """
        acquired, expires = self._acquired, self._expires
        if type(acquired) is int and type(expires) is int:
            # A listing's common case, inline: no call per time.
            a_second, a_ms = divmod(acquired, 1000)
            e_second, e_ms = divmod(expires, 1000)
            a_text = _ISO_SECONDS.get(a_second) or _iso_second(a_second)
            e_text = _ISO_SECONDS.get(e_second) or _iso_second(e_second)
            if timespec == "auto":
                return a_text + _ISO_FRACTIONS[a_ms], e_text + _ISO_FRACTIONS[e_ms]
            if timespec == "seconds":
                return a_text + "+00:00", e_text + "+00:00"
        return _isoformat(acquired, timespec), _isoformat(expires, timespec)

    def as_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (the token is never included)."""
        acquired, expires = self.isoformat()
        return {
            "backend": self._backend,
            "name": self._name,
            "holder": {"host": self._host, "pid": self._pid, "thread": self._thread},
            "acquired_at": acquired,
            "expires_at": expires,
            "fencing_token": self._fencing_token,
            "kind": self._kind.mode,
            "limit": self._kind.limit,
        }

    def as_json(self) -> str:
        """Return ``json.dumps(self.as_dict())``, made without the dict."""
        pid, fence = self._pid, self._fencing_token
        if not (pid is None or type(pid) is int) or not (
            fence is None or type(fence) is int
        ):
            return json.dumps(self.as_dict())
        acquired, expires = self.isoformat()
        # ISO 8601 times need no escaping (digits and "-:T.+"), only quotes.
        acquired = "null" if acquired is None else '"' + acquired + '"'
        expires = "null" if expires is None else '"' + expires + '"'
        return (
            f'{{"backend": {_encode(self._backend)}, "name": {_encode(self._name)}, '
            f'"holder": {{"host": {_encode(self._host)}, '
            f'"pid": {"null" if pid is None else pid}, '
            f'"thread": {_encode(self._thread)}}}, '
            f'"acquired_at": {acquired}, "expires_at": {expires}, '
            f'"fencing_token": {"null" if fence is None else fence}, '
            f'"kind": "{self._kind.mode}", '
            f'"limit": {"null" if self._kind.limit is None else self._kind.limit}}}'
        )

    def _fields(self) -> tuple:
        return (
            self._backend,
            self._name,
            self._token,
            self._host,
            self._pid,
            self._thread,
            self.acquired_at,
            self.expires_at,
            self._fencing_token,
            self._kind,
        )

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(backend={self._backend!r}, name={self._name!r}, "
            f"token={self._token!r}, host={self._host!r}, pid={self._pid!r}, "
            f"thread={self._thread!r}, acquired_at={self.acquired_at!r}, "
            f"expires_at={self.expires_at!r}, "
            f"fencing_token={self._fencing_token!r}, kind={self._kind!r})"
        )
