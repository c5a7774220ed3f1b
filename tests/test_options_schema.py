"""The OPTIONS schema a backend declares is read by one generic system check.

A backend written here declares every type of option; the checks report its
unknown keys and bad values with the declared ids and hints, and its
``check_entry`` hook after them. The bundled backends' ids are tested with
their backends and in ``test_checks.py``.
"""

from __future__ import annotations

import pytest
from django.core.checks import Error
from django.test import override_settings

from django_distlock.backends.base import BaseLockBackend
from django_distlock.backends.options import (
    Bool,
    CacheAlias,
    Choice,
    DatabaseAlias,
    Dict,
    Integer,
    Number,
    Option,
    Seconds,
    Text,
    check_options,
)
from django_distlock.checks import check_locks_setting

BACKEND = "tests.test_options_schema.SchemaBackend"
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "redis": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://h"},
}


class SchemaBackend(BaseLockBackend):
    """A backend that only declares OPTIONS (never instantiated)."""

    options_schema = {
        "TIMEOUT": Seconds("Seconds to wait."),
        "JITTER": Seconds("Seconds of jitter.", zero_ok=True),
        "FACTOR": Number("A fraction.", zero_ok=True),
        "REPLICAS": Integer("How many replicas.", minimum=0),
        "FAST": Bool("Go fast.", id="distlock.E015"),
        "KWARGS": Dict("Keyword arguments."),
        "NAME": Text("The service's name.", what="the service"),
        "MODE": Choice("Poll or notify.", choices=("poll", "notify")),
        "DATABASE": DatabaseAlias("A DATABASES alias.", default="default"),
        "CACHE": CacheAlias("A redis cache.", backend="django_redis."),
        "ANYTHING": Option("Passed on unchecked."),
    }

    @classmethod
    def check_entry(cls, alias, params):
        """Report LOCATION 'bad' (the hook runs after the schema)."""
        if params.get("LOCATION") == "bad":
            return [Error("bad", hint="h", obj="settings.LOCKS", id="distlock.E004")]
        return []


class ZooLikeBackend(SchemaBackend):
    """The same schema, whose OPTIONS problems have an id of their own."""

    options_check_id = "distlock.E016"


class UndeclaredBackend(BaseLockBackend):
    """A backend that declares no schema: its OPTIONS are not checked."""


def messages(options, backend=SchemaBackend, **entry):
    """Return the check messages of a LOCKS entry with these OPTIONS."""
    params = {"BACKEND": BACKEND, "OPTIONS": options, **entry}
    return backend.check("default", params)


GOOD = {
    "TIMEOUT": 0.5,
    "JITTER": 0,
    "FACTOR": 0.01,
    "REPLICAS": 0,
    "FAST": True,
    "KWARGS": {"a": 1},
    "NAME": "main",
    "MODE": "notify",
    "DATABASE": "default",
    "CACHE": "redis",
    "ANYTHING": object(),
}


def test_valid_options_give_no_message():
    with override_settings(CACHES=CACHES):
        assert messages(GOOD) == []
        assert messages({}) == []


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("TIMEOUT", 0, "must be a positive number of seconds, not 0"),
        ("TIMEOUT", -1, "must be a positive number of seconds, not -1"),
        ("TIMEOUT", True, "must be a positive number of seconds, not True"),
        ("TIMEOUT", "1", "must be a positive number of seconds, not '1'"),
        ("TIMEOUT", None, "must be a positive number of seconds, not None"),
        ("TIMEOUT", float("inf"), "must be a positive number of seconds, not inf"),
        ("TIMEOUT", float("nan"), "must be a positive number of seconds, not nan"),
        ("JITTER", -0.1, "must be a non-negative number of seconds, not -0.1"),
        ("FACTOR", -1, "must be a non-negative number, not -1"),
        ("REPLICAS", -1, "must be an integer >= 0, not -1"),
        ("REPLICAS", 1.0, "must be an integer >= 0, not 1.0"),
        ("REPLICAS", False, "must be an integer >= 0, not False"),
        ("FAST", 1, "must be True or False"),
        ("KWARGS", [("a", 1)], "must be a dict"),
        ("NAME", "", "must name the service, not ''"),
        ("NAME", 3, "must name the service, not 3"),
        ("MODE", "sleep", "must be 'poll' or 'notify', not 'sleep'"),
        ("DATABASE", "nope", "is 'nope', which is not in settings.DATABASES"),
        ("DATABASE", 3, "is 3, which is not in settings.DATABASES"),
        ("CACHE", "default", "is 'default', which is not a cache in CACHES"),
        ("CACHE", "missing", "is 'missing', which is not a cache in CACHES"),
    ],
)
def test_bad_value_is_one_message_with_the_options_hint(key, value, problem):
    with override_settings(CACHES=CACHES):
        (message,) = messages({**GOOD, key: value})
    assert message.msg == f"LOCKS['default']['OPTIONS'][{key!r}] {problem}."
    assert message.hint == SchemaBackend.options_schema[key].help
    assert message.obj == "settings.LOCKS" and message.is_serious()


def test_ids_option_then_type_then_backend():
    bad = {"TIMEOUT": 0, "FAST": "yes", "DATABASE": "nope", "CACHE": "x"}
    ids = {m.msg.split("'")[5]: m.id for m in messages(bad)}
    assert ids == {
        "TIMEOUT": "distlock.E009",  # the backend's default id
        "FAST": "distlock.E015",  # the option's own
        "DATABASE": "distlock.E012",  # the type's
        "CACHE": "distlock.E010",
    }
    ids = {m.msg.split("'")[5]: m.id for m in messages(bad, backend=ZooLikeBackend)}
    assert ids["TIMEOUT"] == "distlock.E016"
    assert ids["FAST"] == "distlock.E015" and ids["DATABASE"] == "distlock.E012"


def test_unknown_keys_are_one_message_naming_the_accepted_ones():
    (message,) = messages({"TIME_OUT": 1, "FAST": True, "BOGUS": 2})
    assert message.id == "distlock.E009"
    assert message.msg == (
        "LOCKS['default']['OPTIONS'] has unknown keys: ['BOGUS', 'TIME_OUT']."
    )
    assert message.hint == f"SchemaBackend accepts {sorted(GOOD)}."
    (message,) = messages({"BOGUS": 2}, backend=ZooLikeBackend)
    assert message.id == "distlock.E016"


def test_a_default_that_can_be_wrong_is_checked_when_left_out():
    class Elsewhere(BaseLockBackend):
        options_schema = {"DATABASE": DatabaseAlias("An alias.", default="nowhere")}

    (message,) = messages({}, backend=Elsewhere)
    assert message.id == "distlock.E012"
    assert message.msg == (
        "LOCKS['default']['OPTIONS']['DATABASE'] is 'nowhere', which is not in "
        "settings.DATABASES."
    )
    assert messages({"DATABASE": "default"}, backend=Elsewhere) == []


def test_the_hook_runs_after_the_schema():
    ids = [m.id for m in messages({"TIMEOUT": 0}, LOCATION="bad")]
    assert ids == ["distlock.E009", "distlock.E004"]
    assert [m.id for m in messages({}, LOCATION="bad")] == ["distlock.E004"]


def test_a_backend_without_a_schema_is_not_checked():
    assert UndeclaredBackend.options_schema is None
    assert UndeclaredBackend.check("x", {"OPTIONS": {"ANY": object()}}) == []
    assert UndeclaredBackend.check_entry("x", {}) == []


def test_not_a_dict_is_left_to_the_generic_check():
    # checks.py reports OPTIONS that are not a dict (distlock.E009) once.
    assert check_options(SchemaBackend, "x", {"OPTIONS": ["TIMEOUT"]}) == []


def test_through_the_system_checks():
    entry = {"BACKEND": BACKEND, "OPTIONS": {"TIMEOUT": 0, "X": 1}}
    with override_settings(LOCKS={"default": entry}, CACHES=CACHES):
        ids = [m.id for m in check_locks_setting()]
    assert ids == ["distlock.E009", "distlock.E009"]
    entry = {"BACKEND": BACKEND, "LOCATION": "bad", "OPTIONS": GOOD}
    with override_settings(LOCKS={"default": entry}, CACHES=CACHES):
        assert [m.id for m in check_locks_setting()] == ["distlock.E004"]


@pytest.mark.parametrize(
    "backend",
    [
        "django_distlock.backends.redis.RedisLockBackend",
        "django_distlock.backends.redis.ReentrantRedisLockBackend",
        "django_distlock.backends.redlock.RedlockBackend",
        "django_distlock.backends.database.DatabaseLockBackend",
        "django_distlock.backends.zookeeper.ZooKeeperLockBackend",
    ],
)
def test_bundled_backends_declare_their_options(backend):
    from django.utils.module_loading import import_string

    cls = import_string(backend)
    assert cls.options_schema
    assert all(isinstance(o, Option) and o.help for o in cls.options_schema.values())
    # Cross-field rules in the hook; the schema reading is the base class's.
    assert cls.check_entry.__func__ is not BaseLockBackend.check_entry.__func__
    assert cls.check.__func__ is BaseLockBackend.check.__func__
