"""The in-process locmem backend: the contract, minus cross-process tests."""

from __future__ import annotations

import pytest

from .contract import LockBackendContract


class TestLocMemContract(LockBackendContract):
    """The shared backend contract on locmem (threads of one process)."""

    cross_process = False

    @pytest.fixture
    def locks_setting(self, request):
        return {
            "default": {
                "BACKEND": "django_distlock.backends.locmem.LocMemLockBackend",
                "LOCATION": request.node.nodeid,
            }
        }
