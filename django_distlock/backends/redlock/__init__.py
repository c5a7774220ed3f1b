"""The Redlock backend: ``django_distlock.backends.redlock.RedlockBackend``."""

from .backend import RedlockBackend
from .steps import MAX_OWED_REPLIES, pack_meta, unpack_meta

__all__ = ["MAX_OWED_REPLIES", "RedlockBackend", "pack_meta", "unpack_meta"]
