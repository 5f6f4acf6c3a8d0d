"""Apache Kafka (KRaft) on 127.0.0.1 from the jars fetched by ``.ci/install-kafka.sh``, no Docker needed.

``deploy/kafka/pom.xml`` pins the version (:data:`KAFKA_VERSION`); the
installer copies ``kafka_2.13`` and its runtime dependencies into
``~/.cache/eroica/kafka/<version>/libs`` (``$EROICA_KAFKA_LIBS`` overrides).
Each node is one JVM, combined controller and broker::

    java -cp 'libs/*' kafka.tools.StorageTool format -t CLUSTER_ID -c node-N/server.properties
    java -cp 'libs/*' kafka.Kafka node-N/server.properties

:class:`KafkaCluster` runs one node (``nodes=1``: replication factor 1, for
most tests and ``eroica up --broker kafka``) or three (a controller quorum of
3, ``default.replication.factor=3``, ``min.insync.replicas=2``, internal
topics with 3 replicas: the failure tests), with :meth:`KafkaCluster.kill`
and :meth:`KafkaCluster.restart` of one node. Every listener binds 127.0.0.1
on a free port; data lives in ``data_dir`` (a temporary directory, removed
on stop, when none is given).

Choices (measured on the 2-core machines, Kafka 4.1.1, Java 17):

- One node is ready (a metadata round trip answers) about 2 s after the JVM
  starts; formatting its storage costs another ~1.3 s of JVM start. Three
  nodes format and start in parallel.
- Small heaps (512 MiB for one node, 384 MiB each for three), the serial GC
  and C1 only: the machines have plenty of memory but two shared cores, and
  these JVMs should start fast and stay out of the way. Thread pools are cut
  to 2, the log cleaner's dedupe buffer to 8 MiB, ``__consumer_offsets`` to 8
  partitions (creating 50 partitions x 3 replicas delays a first group join).
- ``group.initial.rebalance.delay.ms=0``: a group's first join is not held 3 s;
  ``group.min.session.timeout.ms=1000`` (Kafka's default floor is 6 s) so the
  2 s consumer sessions the tests use on tansu are accepted here too.
- Broker heartbeats every 500 ms and a 4 s session: a killed node is fenced,
  and its partitions get new leaders, within ~4 s instead of ~9 s.
- ``auto.create.topics.enable`` stays on, like tansu, with
  ``num.partitions=8`` (``EROICA_KAFKA_PARTITIONS``'s default); Eroica creates
  its topics explicitly anyway (``eroica.kafka.admin.create_topics``, with the
  broker's default replication factor).
"""

from __future__ import annotations

import base64
import ctypes
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Mapping

from eroica.kafka.admin import BrokerError
from eroica.runtime.system import free_port

from .tansu import _quiet_admin

__all__ = ["KAFKA_VERSION", "KafkaCluster", "java_binary", "kafka_libs", "kafka_available", "KAFKA_MAIN"]

KAFKA_VERSION = "4.1.1"  # keep equal to <kafka.version> in deploy/kafka/pom.xml (a test checks)
KAFKA_MAIN = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
DEFAULT_START_TIMEOUT_S = 90.0
DEFAULT_STOP_TIMEOUT_S = 10.0
_PR_SET_PDEATHSIG = 1
_BIND_ERROR = re.compile(r"Address already in use|BindException|Socket server failed to bind")


def default_libs_dir(version: str = KAFKA_VERSION) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "eroica" / "kafka" / version / "libs"


def kafka_libs() -> Path | None:
    """The directory of Kafka's jars (``$EROICA_KAFKA_LIBS``, else the installer's cache), or None."""
    override = os.environ.get("EROICA_KAFKA_LIBS")
    path = Path(override) if override else default_libs_dir()
    if path.is_dir() and any(path.glob("kafka_2.13-*.jar")) and any(path.glob("kafka-server-*.jar")):
        return path
    return None


def java_binary() -> str | None:
    """``$JAVA_HOME/bin/java``, else ``java`` on PATH, or None."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def kafka_available() -> str | None:
    """None when Apache Kafka can be started here, else why not (for skips and errors)."""
    if java_binary() is None:
        return "java not found (install a JDK 17+, or set JAVA_HOME)"
    if kafka_libs() is None:
        where = os.environ.get("EROICA_KAFKA_LIBS") or default_libs_dir()
        return f"Apache Kafka {KAFKA_VERSION} jars not found in {where}: run .ci/install-kafka.sh"
    return None


def random_cluster_id() -> str:
    """What ``kafka-storage random-uuid`` prints (URL-safe base64 of 16 random bytes), without a JVM."""
    while True:
        cid = base64.urlsafe_b64encode(secrets.token_bytes(16)).decode().rstrip("=")
        if not cid.startswith("-"):  # Kafka avoids these too (they read as options)
            return cid


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


_LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


@dataclass
class _Node:
    index: int
    dir: Path
    broker_port: int
    controller_port: int
    proc: subprocess.Popen | None = None

    @property
    def node_id(self) -> int:
        return self.index + 1

    @property
    def properties(self) -> Path:
        return self.dir / "server.properties"

    @property
    def log_path(self) -> Path:
        return self.dir / "server.log"

    @property
    def stdout_path(self) -> Path:
        return self.dir / "stdout.log"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class KafkaCluster:
    """Context manager running ``nodes`` combined KRaft nodes of Apache Kafka on 127.0.0.1.

    ``nodes``: 1 (replication factor 1) or 3 (replication factor 3,
    ``min.insync.replicas=2``); any other count works with replication
    ``min(nodes, 3)``. ``data_dir``: where each node keeps ``node-N/``
    (``server.properties``, ``server.log``, ``data/``); a temporary directory
    removed on stop when None. A data directory already formatted by an
    earlier run is reused (Kafka keeps its topics). ``heap_mb`` per JVM
    (default 512 for one node, 384 each for more). ``overrides``: extra broker
    properties for every node.
    """

    def __init__(self, nodes: int = 1, data_dir: Path | None = None, *, heap_mb: int | None = None,
                 start_timeout_s: float = DEFAULT_START_TIMEOUT_S, overrides: Mapping[str, object] | None = None,
                 libs: Path | None = None, java: str | None = None) -> None:
        if nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {nodes}")
        self.size = nodes
        self._data_dir = Path(data_dir) if data_dir is not None else None
        self.heap_mb = heap_mb or (512 if nodes == 1 else 384)
        self._start_timeout_s = start_timeout_s
        self._overrides = dict(overrides or {})
        self._libs = libs
        self._java = java
        self._tmp: str | None = None
        self.nodes: list[_Node] = []
        self.cluster_id: str | None = None
        self.start_seconds: float | None = None

    # -- where things are -------------------------------------------------------------
    @property
    def _dir(self) -> Path:
        if self._data_dir is not None:
            return self._data_dir
        if self._tmp is None:
            self._tmp = tempfile.mkdtemp(prefix="eroica-kafka-")
        return Path(self._tmp)

    @property
    def bootstrap(self) -> str:
        if not self.nodes:
            raise BrokerError("Kafka not started")
        return ",".join(f"127.0.0.1:{n.broker_port}" for n in self.nodes)

    def node_bootstrap(self, index: int) -> str:
        return f"127.0.0.1:{self.nodes[index].broker_port}"

    @property
    def pids(self) -> list[int | None]:
        return [n.proc.pid if n.running and n.proc is not None else None for n in self.nodes]

    @property
    def running(self) -> bool:
        """Whether every node's JVM is alive."""
        return bool(self.nodes) and all(n.running for n in self.nodes)

    def is_running(self, index: int) -> bool:
        return self.nodes[index].running

    @property
    def replication_factor(self) -> int:
        return min(self.size, 3)

    @property
    def min_insync_replicas(self) -> int:
        return 1 if self.replication_factor == 1 else 2

    # -- configuration ----------------------------------------------------------------------
    def properties(self, node: _Node) -> dict[str, object]:
        rf, isr = self.replication_factor, self.min_insync_replicas
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        props: dict[str, object] = {
            "process.roles": "broker,controller",
            "node.id": node.node_id,
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://127.0.0.1:{node.broker_port},CONTROLLER://127.0.0.1:{node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.broker_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(node.dir / "data"),
            "num.partitions": 8,
            "default.replication.factor": rf,
            "min.insync.replicas": isr,
            "unclean.leader.election.enable": "false",
            "offsets.topic.replication.factor": rf,
            "offsets.topic.num.partitions": 8,
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": isr,
            "transaction.state.log.num.partitions": 4,
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": isr,
            "group.initial.rebalance.delay.ms": 0,
            # Kafka's floor is 6 s; the tests and tansu-tuned settings use 2 s sessions (tansu's
            # JoinGroup waits half of it). A dev/test broker accepts them; production keeps 6 s.
            "group.min.session.timeout.ms": 1000,
            "broker.heartbeat.interval.ms": 500,
            "broker.session.timeout.ms": 4000,
            "num.network.threads": 2,
            "num.io.threads": 2,
            "background.threads": 2,
            "num.recovery.threads.per.data.dir": 1,
            "num.replica.fetchers": 1,
            "log.cleaner.threads": 1,
            "log.cleaner.dedupe.buffer.size": 8 * 1024 * 1024,
            "log.segment.bytes": 16 * 1024 * 1024,
            "log.retention.hours": 24,
            "auto.create.topics.enable": "true",
        }
        props.update(self._overrides)
        return props

    def _write_config(self, node: _Node) -> None:
        node.dir.mkdir(parents=True, exist_ok=True)
        node.properties.write_text("".join(f"{k}={v}\n" for k, v in self.properties(node).items()))
        (node.dir / "log4j2.properties").write_text(_LOG4J2.format(log=node.log_path))

    def _java_argv(self, node: _Node, main: str, *args: str, heap_mb: int | None = None) -> list[str]:
        java = self._java or java_binary()
        libs = self._libs or kafka_libs()
        if java is None or libs is None:
            raise BrokerError(f"cannot start Apache Kafka: {kafka_available()}")
        return [java, f"-Xmx{heap_mb or self.heap_mb}m", "-Xms64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                "-XX:-UsePerfData", "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={node.dir / 'log4j2.properties'}", f"-Dkafka.logs.dir={node.dir}",
                "-cp", f"{libs}/*", main, *args]

    # -- start ---------------------------------------------------------------------------
    def _plan(self) -> None:
        """Node directories and free ports (new ones on every call)."""
        taken: set[int] = set()

        def port() -> int:
            p = free_port()
            while p in taken:
                p = free_port()
            taken.add(p)
            return p

        self.nodes = [_Node(i, self._dir / f"node-{i + 1}", port(), port()) for i in range(self.size)]

    def _cluster_id(self) -> str:
        path = self._dir / "cluster.id"
        if path.is_file():
            return path.read_text().strip()
        cid = random_cluster_id()
        path.write_text(cid + "\n")
        return cid

    def _format(self, node: _Node) -> None:
        if (node.dir / "data" / "meta.properties").is_file():
            return  # formatted by an earlier run: keep its data
        assert self.cluster_id is not None
        argv = self._java_argv(node, STORAGE_TOOL, "format", "-t", self.cluster_id, "-c", str(node.properties),
                               "--ignore-formatted", heap_mb=256)
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise BrokerError(f"formatting Kafka storage of node {node.node_id} failed (status {r.returncode}): "
                              f"{(r.stdout + r.stderr)[-2000:]}")

    def _launch(self, node: _Node) -> None:
        with open(node.stdout_path, "ab") as out:
            node.proc = subprocess.Popen(self._java_argv(node, KAFKA_MAIN, str(node.properties)), stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=_die_with_parent if sys.platform == "linux" else None)

    def start(self) -> "KafkaCluster":
        """Format (first time) and start every node; return once all brokers are registered and answer."""
        if any(n.running for n in self.nodes):
            return self
        reason = None if (self._java and self._libs) else kafka_available()
        if reason:
            raise BrokerError(f"cannot start Apache Kafka: {reason}")
        t0 = time.monotonic()
        self._dir.mkdir(parents=True, exist_ok=True)
        self.cluster_id = self._cluster_id()
        for attempt in range(3):
            self._plan()
            for node in self.nodes:
                self._write_config(node)
            with ThreadPoolExecutor(max_workers=self.size) as pool:
                list(pool.map(self._format, self.nodes))
            for node in self.nodes:
                self._launch(node)
            try:
                self._wait_ready(range(self.size), self._start_timeout_s)
                self.start_seconds = time.monotonic() - t0
                return self
            except BrokerError as exc:
                bind_clash = any(_BIND_ERROR.search(self._log_tail(n)) for n in self.nodes)
                self._stop_nodes(self.nodes, timeout_s=3.0)
                if not bind_clash or attempt == 2:
                    self._cleanup()
                    raise exc
        raise AssertionError("unreachable")

    def _registered(self, bootstrap: str) -> set[int]:
        md = _quiet_admin(bootstrap).list_topics(timeout=2.0)
        return set(md.brokers)

    def _wait_ready(self, indexes: range | list[int], timeout_s: float) -> None:
        """Wait until each node's JVM lives and the cluster's metadata lists its broker."""
        wanted = {self.nodes[i].node_id for i in indexes}
        deadline = time.monotonic() + timeout_s
        last: Exception | str = "no answer yet"
        while time.monotonic() < deadline:
            for i in indexes:
                node = self.nodes[i]
                if node.proc is not None and node.proc.poll() is not None:
                    raise BrokerError(f"Kafka node {node.node_id} exited with status {node.proc.returncode} at "
                                      f"start; log {node.log_path}:\n{self._log_tail(node)}")
            try:
                seen = self._registered(self.bootstrap_of_live())
                if wanted <= seen:
                    return
                last = f"brokers registered: {sorted(seen)}, waiting for {sorted(wanted)}"
            except Exception as exc:  # not listening yet / no metadata yet
                last = exc
            time.sleep(0.1)
        tails = "\n".join(f"node {self.nodes[i].node_id}: {self._log_tail(self.nodes[i], 600)}" for i in indexes)
        raise BrokerError(f"Apache Kafka on {self.bootstrap} not ready within {timeout_s:.0f} s ({last}):\n{tails}")

    def bootstrap_of_live(self) -> str:
        live = [n for n in self.nodes if n.running] or self.nodes
        return ",".join(f"127.0.0.1:{n.broker_port}" for n in live)

    def _log_tail(self, node: _Node, chars: int = 2000) -> str:
        text = ""
        for path in (node.stdout_path, node.log_path):
            try:
                text += path.read_text(errors="replace")[-chars:]
            except OSError:
                pass
        return text[-chars:].strip() or "(empty log)"

    # -- failures -----------------------------------------------------------------------
    def kill(self, index: int) -> None:
        """SIGKILL node ``index`` (0-based): no clean shutdown, no leadership hand-over."""
        node = self.nodes[index]
        if node.proc is not None and node.proc.poll() is None:
            node.proc.kill()
            node.proc.wait(timeout=10)

    def restart(self, index: int, timeout_s: float | None = None) -> None:
        """Start node ``index`` again (same ports and data) after :meth:`kill`/:meth:`stop_node`; wait till registered."""
        node = self.nodes[index]
        if node.running:
            self.kill(index)
        self._launch(node)
        self._wait_ready([index], timeout_s or self._start_timeout_s)

    def stop_node(self, index: int, timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> None:
        """SIGTERM node ``index`` (a controlled shutdown), SIGKILL after ``timeout_s``."""
        self._stop_nodes([self.nodes[index]], timeout_s)

    def leader(self, topic: str, partition: int = 0, timeout_s: float = 10.0) -> int:
        """Index (0-based) of the node leading ``topic``/``partition`` now."""
        deadline = time.monotonic() + timeout_s
        while True:
            md = _quiet_admin(self.bootstrap_of_live()).list_topics(topic, timeout=5.0)
            t = md.topics.get(topic)
            p = t.partitions.get(partition) if t is not None and t.error is None else None
            if p is not None and p.leader >= 1:
                return p.leader - 1
            if time.monotonic() >= deadline:
                raise BrokerError(f"no leader for {topic}[{partition}] within {timeout_s:.0f} s")
            time.sleep(0.1)

    # -- stop -----------------------------------------------------------------------------
    def _stop_nodes(self, nodes: list[_Node], timeout_s: float) -> None:
        live = [n for n in nodes if n.proc is not None and n.proc.poll() is None]
        for n in live:
            n.proc.terminate()  # type: ignore[union-attr]
        deadline = time.monotonic() + timeout_s
        for n in live:
            assert n.proc is not None
            try:
                n.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                n.proc.kill()
                n.proc.wait(timeout=10)

    def stop(self, timeout_s: float = DEFAULT_STOP_TIMEOUT_S, *, kill: bool = False) -> None:
        """SIGTERM every node (all at once), SIGKILL after ``timeout_s``; ``kill``: SIGKILL at once.

        A controlled shutdown of three nodes takes ~5 s (each hands over its
        leaderships); a test cluster whose data is thrown away need not wait.
        """
        if kill:
            for i in range(len(self.nodes)):
                self.kill(i)
        self._stop_nodes(self.nodes, timeout_s)
        self._cleanup()

    def _cleanup(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> "KafkaCluster":
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
