"""Lock names: any str is a lock of its own, and keys stay small and prefixed."""

from __future__ import annotations

import pytest
from django.test import override_settings
from hypothesis import given, settings
from hypothesis import strategies as st

from django_distlock import lock, locks
from django_distlock.backends.redis import LockKeys
from django_distlock.keys import (
    decode_name,
    encode_name,
    glob_escape,
    name_digest,
)

from .conftest import redis_locks

#: Any str, lone surrogates included (st.text() leaves those out).
ANY_TEXT = st.text(alphabet=st.characters(exclude_categories=()))

NAMES = [
    "*",
    "?",
    "[",
    "]",
    "[a-z]",
    "a*",
    "a?",
    "\n",
    "a\nb",
    "\0",
    "a\0b",
    "a\0",
    " ",
    "a b",
    "a ",
    "",
    "é",
    "e\u0301",  # the same text as "é" once normalised: still another lock
    "Å",
    "\u212b",  # ANGSTROM SIGN, NFC-equal to "Å"
    "锁",
    "🔒",
    "\ud800",  # lone surrogates: not valid Unicode, still valid names
    "\udfff",
    "a\ud800b",
    "a:{b}",
    "a:{b}:q",
    "distlock:{x}",
    "{",
    "}",
    "\\",
    "\\*",
    "x" * 1_000_000,
    "x" * 1_000_001,
]


def test_sample_names_are_distinct_strings():
    assert len(set(NAMES)) == len(NAMES)


@pytest.mark.redis
class TestNamesOnRedis:
    @pytest.fixture(autouse=True)
    def _redis(self, redis_url):
        with override_settings(LOCKS=redis_locks(redis_url, KEY_PREFIX="pfx")):
            yield

    def test_every_name_is_its_own_lock(self, redis_server):
        held = []
        try:
            for name in NAMES:
                handle = lock(name, timeout=0)
                assert handle.acquire(), f"{name[:20]!r} collided with another name"
                held.append(handle)
            client = redis_server.client()
            keys = client.keys("*")
            assert len(keys) == len(NAMES)
            for key in keys:
                assert key.startswith(b"pfx:{")
                assert len(key) < 60
            listed = sorted(h.name for h in locks["default"].holders())
            assert listed == sorted(NAMES)
            for name in NAMES:
                assert lock(name, timeout=0).acquire() is False
        finally:
            for handle in held:
                handle.release()
        assert redis_server.client().keys("*") == []

    def test_prefix_listing_of_long_and_odd_names(self):
        with lock("x" * 1_000_000), lock("a:{b}"), lock("a\0b"):
            backend = locks["default"]
            assert [h.name for h in backend.holders("xxx")] == ["x" * 1_000_000]
            assert [h.name for h in backend.holders("a\0")] == ["a\0b"]
            assert [h.name for h in backend.holders("a:{")] == ["a:{b}"]

    def test_key_prefix_with_glob_characters(self, redis_url, redis_server):
        with override_settings(LOCKS=redis_locks(redis_url, KEY_PREFIX="p*[x]")):
            with lock("a"):
                with override_settings(
                    LOCKS=redis_locks(redis_url, KEY_PREFIX="pa[x]")
                ):
                    # Another prefix lists none of them, even if its glob matches.
                    assert list(locks["default"].holders()) == []
                assert [h.name for h in locks["default"].holders()] == ["a"]


class TestLocMemNames:
    def test_every_name_is_its_own_lock(self):
        setting = {
            "default": {
                "BACKEND": "django_distlock.backends.locmem.LocMemLockBackend",
                "LOCATION": "names",
            }
        }
        with override_settings(LOCKS=setting):
            held = [lock(n, timeout=0) for n in NAMES]
            for h in held:
                assert h.acquire()
            assert sorted(h.name for h in locks["default"].holders()) == sorted(NAMES)
            for h in held:
                h.release()


class TestKeys:
    def test_digest_is_fixed_length_and_key_safe(self):
        for name in NAMES:
            digest = name_digest(name)
            assert len(digest) == 43
            assert digest.isascii()
            assert not set(digest) & set("{}*?[]\\: \n\0")

    def test_keys_of_one_lock_share_a_hash_tag_inside_the_prefix(self):
        keys = LockKeys("pfx", "a:{b}")
        tag = keys.lease[len("pfx:") :]
        assert keys.lease.startswith("pfx:{") and keys.lease.endswith("}")
        for other in (keys.queue, keys.records, keys.wake_prefix + "t"):
            assert other.startswith(keys.lease)
            assert other[len("pfx:") :].startswith(tag)

    def test_glob_escape(self):
        assert glob_escape("a*b?c[d]e\\f") == "a\\*b\\?c\\[d\\]e\\\\f"

    @given(ANY_TEXT)
    def test_encode_round_trips(self, name):
        assert decode_name(encode_name(name)) == name

    def test_lone_surrogates_round_trip(self):
        for name in ("\ud800", "a\udfffb"):
            assert decode_name(encode_name(name)) == name

    @settings(max_examples=500)
    @given(ANY_TEXT, ANY_TEXT)
    def test_distinct_names_never_share_a_key(self, a, b):
        if a != b:
            assert name_digest(a) != name_digest(b)
            assert LockKeys("p", a).lease != LockKeys("p", b).lease

    @given(
        st.lists(
            st.text(alphabet=st.characters(exclude_categories=()), max_size=12),
            unique=True,
            max_size=50,
        )
    )
    def test_digests_of_distinct_names_are_distinct(self, names):
        assert len({name_digest(n) for n in names}) == len(names)
