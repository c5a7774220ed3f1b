"""The ZooKeeper backend (``ZooKeeperLockBackend``), one module per concern."""

from .backend import ZooKeeperLockBackend

__all__ = ["ZooKeeperLockBackend"]
