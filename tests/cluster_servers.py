"""Scale-out servers for the tests: a Redis Cluster, a Sentinel set-up, ZooKeeper.

Everything runs on free loopback ports from the binaries on this machine
(``redis-server``, ``redis-cli``, Debian's ``zookeeper`` package with Java),
and each helper stops exactly the processes it started. A missing binary
skips locally and fails under ``CI=true`` (:func:`tests.servers.unavailable`);
``scripts/bootstrap`` installs them on a fresh machine.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .procs import run_in_processes
from .servers import (
    RedisServer,
    ServerExited,
    free_port,
    on_new_ports,
    port_open,
    unavailable,
)

__all__ = [
    "RedisCluster",
    "SentinelSetup",
    "ServerExited",
    "ZooKeeperEnsemble",
    "ZooKeeperServer",
    "wait_until",
]


def wait_until(predicate, timeout: float, what: str, interval: float = 0.1):
    """Poll ``predicate`` until it returns a truthy value; raise on timeout,
    or at once if it raises :class:`ServerExited`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except ServerExited:
            raise
        except Exception:  # noqa: BLE001 - a server still starting
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def _redis_client(port: int):
    import redis

    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)


class RedisCluster:
    """Three primaries and three replicas (``--cluster-replicas 1``) on loopback.

    ``--cluster-node-timeout`` is short so that a killed primary is failed
    over by its replica within seconds, yet long enough that a node starved
    of CPU on a loaded test machine is not failed over by mistake.
    """

    NODE_TIMEOUT_MS = 3000

    def __init__(self, size: int = 6):
        if shutil.which("redis-cli") is None:
            unavailable("redis-cli is not on PATH")
        self.nodes = [
            RedisServer(
                free_port(bus=True),
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                str(self.NODE_TIMEOUT_MS),
                "--cluster-replica-validity-factor",
                "0",
            )
            for _ in range(size)
        ]

    @property
    def url(self) -> str:
        """A ``redis+cluster://`` LOCATION naming every node as a startup node."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self) -> RedisCluster:
        try:
            for node in self.nodes:
                node.start()
            subprocess.run(
                [
                    "redis-cli",
                    "--cluster",
                    "create",
                    *(f"127.0.0.1:{n.port}" for n in self.nodes),
                    "--cluster-replicas",
                    "1",
                    "--cluster-yes",
                ],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=120,
            )
            wait_until(self.healthy, 120, "the cluster to report cluster_state:ok")
        except BaseException:
            self.stop()
            raise
        return self

    def alive(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.proc and n.proc.poll() is None]

    def healthy(self) -> bool:
        """True if every live node sees the cluster as ok."""
        for node in self.alive():
            info = _redis_client(node.port).execute_command("CLUSTER INFO")
            if str(info.get("cluster_state")) != "ok":
                return False
        return True

    def primary_of(self, key: str) -> RedisServer:
        """Return the live node that is primary for ``key``'s slot."""
        from redis.cluster import RedisCluster as Client

        client = Client(host="127.0.0.1", port=self.alive()[0].port)
        try:
            port = client.get_node_from_key(key).port
        finally:
            client.close()
        return next(n for n in self.nodes if n.port == port)

    def replica_of(self, primary: RedisServer) -> RedisServer:
        """Return the live replica of ``primary``."""
        for node in self.alive():
            role = _redis_client(node.port).execute_command("ROLE")
            if role[0] == b"slave" and int(role[2]) == primary.port:
                return node
        raise LookupError(f"no live replica of port {primary.port}")

    def is_synced_replica(self, node: RedisServer) -> bool:
        """True if ``node`` is a replica whose link to its primary is up and
        that its primary counts as online.

        The replica reports its link up before the primary has its first
        acknowledgement; until then a WAIT on the primary counts it out.
        """
        role = _redis_client(node.port).execute_command("ROLE")
        if role[0] != b"slave" or role[3] != b"connected":
            return False
        return _redis_client(int(role[2])).execute_command("WAIT", 1, 100) >= 1

    def is_primary(self, node: RedisServer) -> bool:
        return _redis_client(node.port).execute_command("ROLE")[0] == b"master"

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


class SentinelSetup:
    """One primary, one replica and three sentinels watching them."""

    SERVICE = "distlock-primary"
    DOWN_AFTER_MS = 3000

    def __init__(self):
        self.primary = RedisServer()
        self.replica = RedisServer(None)
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinel_procs: list[subprocess.Popen] = []
        self.dir = tempfile.mkdtemp(prefix="distlock-sentinel-")

    @property
    def sentinels(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", p) for p in self.sentinel_ports]

    def start(self) -> SentinelSetup:
        try:
            self.primary.start()
            self.replica.args = ("--replicaof", "127.0.0.1", str(self.primary.port))
            self.replica.start()
            wait_until(self._replica_synced, 60, "the replica to sync")
            for port in self.sentinel_ports:
                self._start_sentinel(port)
            wait_until(self._sentinels_ready, 60, "the sentinels to see the set-up")
        except BaseException:
            self.stop()
            raise
        return self

    def _replica_synced(self) -> bool:
        info = _redis_client(self.replica.port).info("replication")
        return info.get("master_link_status") == "up"

    def _start_sentinel(self, port: int) -> None:
        conf = os.path.join(self.dir, f"sentinel-{port}.conf")
        with open(conf, "w") as f:
            f.write(
                f"port {port}\n"
                "bind 127.0.0.1\n"
                f"dir {self.dir}\n"
                f"logfile {self.dir}/sentinel-{port}.log\n"
                f"sentinel monitor {self.SERVICE} 127.0.0.1 {self.primary.port} 2\n"
                f"sentinel down-after-milliseconds {self.SERVICE} "
                f"{self.DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {self.SERVICE} 10000\n"
                f"sentinel parallel-syncs {self.SERVICE} 1\n"
            )
        proc = subprocess.Popen(
            ["redis-server", conf, "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.sentinel_procs.append(proc)
        wait_until(lambda: port_open("127.0.0.1", port, 0.2), 20, "a sentinel")

    def _sentinels_ready(self) -> bool:
        for port in self.sentinel_ports:
            c = _redis_client(port)
            fields = c.sentinel_master(self.SERVICE)
            if int(fields.get("num-other-sentinels", 0)) < 2:
                return False
            if int(fields.get("num-slaves", 0)) < 1:
                return False
        return True

    def current_primary_port(self) -> int:
        c = _redis_client(self.sentinel_ports[0])
        host, port = c.sentinel_get_master_addr_by_name(self.SERVICE)
        return int(port)

    def stop(self) -> None:
        for proc in self.sentinel_procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.sentinel_procs = []
        self.primary.stop()
        self.replica.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def zookeeper_classpath() -> str | None:
    """Return the classpath of Debian's ZooKeeper server, or None if missing."""
    jar = "/usr/share/java/zookeeper.jar"
    if not os.path.exists(jar) or shutil.which("java") is None:
        return None
    extra = [
        p
        for pattern in ("slf4j-api*.jar", "slf4j-simple*.jar", "log4j-1.2*.jar")
        for p in sorted(glob.glob(os.path.join("/usr/share/java", pattern)))
    ]
    return ":".join([jar, *extra])


class ZooKeeperServer:
    """A single-node ZooKeeper (standalone mode) with its own data directory.

    ``tickTime`` is short (100 ms) so that sessions may be as short as
    200 ms: the tests can expire one in well under a second.
    """

    TICK_MS = 100

    def __init__(self, myid: int | None = None, ensemble: str = ""):
        self.classpath = zookeeper_classpath()
        if self.classpath is None:
            unavailable("ZooKeeper is not installed (apt-get install zookeeper)")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="distlock-zk-")
        self.proc: subprocess.Popen | None = None
        # An ensemble member: its id and the ``server.N=...`` lines.
        self.myid = myid
        self.ensemble = ensemble

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> ZooKeeperServer:
        """Start it (again, after :meth:`kill`: on the same port)."""
        # Only a standalone server's first start may move to another port.
        tries = 3 if self.myid is None and self.proc is None else 1
        return on_new_ports(self._start, self._redraw, tries)

    def _redraw(self) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="distlock-zk-")

    def _start(self) -> ZooKeeperServer:
        data = os.path.join(self.dir, "data")
        os.makedirs(data, exist_ok=True)
        conf = os.path.join(self.dir, "zoo.cfg")
        with open(conf, "w") as f:
            f.write(
                f"tickTime={self.TICK_MS}\n"
                f"dataDir={data}\n"
                f"clientPort={self.port}\n"
                "clientPortAddress=127.0.0.1\n"
                "maxClientCnxns=0\n"
                "admin.enableServer=false\n"
                "4lw.commands.whitelist=ruok,srvr,wchp,conf\n"
                "minSessionTimeout=200\n"
                "maxSessionTimeout=60000\n"
            )
            if self.myid is not None:
                f.write(f"initLimit=100\nsyncLimit=30\n{self.ensemble}")
        if self.myid is not None:
            with open(os.path.join(data, "myid"), "w") as f:
                f.write(f"{self.myid}\n")
        main = (
            "org.apache.zookeeper.server.quorum.QuorumPeerMain"
            if self.myid is not None
            else "org.apache.zookeeper.server.ZooKeeperServerMain"
        )
        self.log = open(os.path.join(self.dir, "zookeeper.log"), "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                "java",
                "-Xmx128m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-Dzookeeper.admin.enableServer=false",
                "-cp",
                self.classpath,
                main,
                conf,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_until(self._ok, 120, "ZooKeeper to answer", interval=0.2)
        except ServerExited:
            self.stop()
            raise
        except BaseException as e:
            tail = self.log_tail()
            self.stop()
            if isinstance(e, RuntimeError):
                raise RuntimeError(f"{e}; zookeeper.log ends:\n{tail}") from e
            raise
        return self

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the server's log."""
        path = os.path.join(self.dir, "zookeeper.log")
        try:
            with open(path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def check_running(self) -> None:
        """Raise :class:`ServerExited` if its process has ended."""
        if self.proc is not None and self.proc.poll() is not None:
            raise ServerExited(
                f"ZooKeeper exited with {self.proc.returncode}; zookeeper.log "
                f"ends:\n{self.log_tail()}"
            )

    def four_letter(self, word: str, timeout: float = 2) -> str:
        """Send a four-letter command; return the whole answer."""
        import socket

        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall(word.encode())
            text = b""
            while chunk := s.recv(4096):
                text += chunk
        return text.decode(errors="replace")

    def _ok(self) -> bool:
        self.check_running()
        if self.four_letter("ruok", timeout=1) != "imok":
            return False
        # This server, not another process's that took the port first (this
        # one then exits, but only once its JVM is done).
        dirs = [
            line.split("=", 1)[1]
            for line in self.four_letter("conf").splitlines()
            if line.startswith("dataDir=")
        ]
        if not dirs:
            # An ensemble member before its quorum forms answers only ruok
            # (and it is started with tries=1: a taken port fails anyway).
            return True
        if not dirs[0].startswith(os.path.join(self.dir, "data")):
            raise ServerExited(f"another process's ZooKeeper answers on {self.port}")
        return True

    def mode(self) -> str:
        """``leader``, ``follower``, ``standalone``, or ``""`` if not serving."""
        try:
            text = self.four_letter("srvr")
        except OSError:
            return ""
        for line in text.splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return ""

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        self.kill()
        if getattr(self, "log", None):
            self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class ZooKeeperEnsemble:
    """Three ZooKeeper servers in one ensemble (a quorum of two)."""

    #: Tries at starting it, each on new ports (see :func:`on_new_ports`).
    ATTEMPTS = 3

    def __init__(self, size: int = 3):
        self.size = size
        self.servers = self._servers()

    def _servers(self) -> list[ZooKeeperServer]:
        ports = [(free_port(), free_port()) for _ in range(self.size)]
        lines = "".join(
            f"server.{i + 1}=127.0.0.1:{quorum}:{election}\n"
            for i, (quorum, election) in enumerate(ports)
        )
        return [ZooKeeperServer(i + 1, lines) for i in range(self.size)]

    @property
    def hosts(self) -> str:
        return ",".join(s.hosts for s in self.servers)

    def start(self) -> ZooKeeperEnsemble:
        return on_new_ports(self._start, self._redraw, self.ATTEMPTS)

    def _start(self) -> ZooKeeperEnsemble:
        try:
            for server in self.servers:
                server.start()
            wait_until(self._elected, 120, "the ensemble to elect a leader")
        except BaseException:
            self.stop()
            raise
        return self

    def _redraw(self) -> None:
        self.servers = self._servers()

    def _elected(self) -> ZooKeeperServer | None:
        """:meth:`leader`, while every member still runs (at the start)."""
        for server in self.servers:
            server.check_running()
        return self.leader()

    def leader(self) -> ZooKeeperServer | None:
        """The current leader, once the others follow it; else None."""
        live = [s for s in self.servers if s.proc and s.proc.poll() is None]
        modes = {s: s.mode() for s in live}
        leaders = [s for s, m in modes.items() if m == "leader"]
        if len(leaders) != 1 or any(m == "" for m in modes.values()):
            return None
        return leaders[0]

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


def failover_worker(name: str, log_path: str, stop_path: str, ttl: float) -> dict:
    """Take ``name`` again and again until ``stop_path`` exists (a spawned worker).

    Append one line ``start end fencing_token pid`` per critical section to
    ``log_path``. Backend errors (a primary being failed over), timeouts and
    lost leases are counted and retried, as an application would. Return the
    counts.
    """
    from django_distlock import lock
    from django_distlock.exceptions import LockBackendError, LockLost, LockNotAcquired

    errors = {"backend": 0, "timeout": 0, "lost": 0, "ok": 0}
    while not os.path.exists(stop_path):
        try:
            with lock(name, ttl=ttl, timeout=5) as held:
                start = time.monotonic()
                token = held.fencing_token
                time.sleep(0.005)
                end = time.monotonic()
            with open(log_path, "a") as log:
                log.write(f"{start} {end} {token} {os.getpid()}\n")
            errors["ok"] += 1
        except LockBackendError:
            errors["backend"] += 1
            time.sleep(0.05)
        except LockNotAcquired:
            errors["timeout"] += 1
        except LockLost:
            errors["lost"] += 1
    return errors


def read_log(path) -> list[tuple[float, float, int, int]]:
    """Parse a :func:`failover_worker` log: ``(start, end, token, pid)`` rows."""
    rows = []
    with open(path) as f:
        for line in f.read().splitlines():
            start, end, token, pid = line.split()
            rows.append((float(start), float(end), int(token), int(pid)))
    return rows


@contextmanager
def failover_load(name: str, log: Path) -> Iterator[list[dict]]:
    """Keep three :func:`failover_worker` processes taking ``name`` meanwhile.

    They log to ``log`` (emptied first); enter once 20 critical sections are
    logged. On exit, stop the workers and wait for them. Yield the list
    their return values are put in when they end.
    """
    stop = log.with_name(log.name + ".stop")
    log.write_text("")
    results: list[dict] = []
    runner = threading.Thread(
        target=lambda: results.extend(
            run_in_processes(
                failover_worker,
                [(name, str(log), str(stop), 2.0) for _ in range(3)],
                timeout=300,
            )
        )
    )
    runner.start()
    try:
        wait_until(lambda: len(read_log(log)) >= 20, 120, "load before")
        yield results
    finally:
        stop.write_text("stop")
        runner.join(300)
