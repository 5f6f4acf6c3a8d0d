"""The single-machine stack: a broker, the stream workers and the sink, supervised.

``eroica up`` runs it in the foreground and ``eroica demo`` in-process. One
:class:`LocalStack` starts, in order:

1. a Kafka-protocol broker on 127.0.0.1, unless an external bootstrap is
   given: ``broker="tansu"`` (the default, :class:`~eroica.stack.tansu.TansuBroker`,
   memory storage, pip-only) or ``broker="kafka"`` (one Apache Kafka KRaft
   node, :class:`~eroica.stack.apache_kafka.KafkaCluster`, from the jars of
   ``.ci/install-kafka.sh``; its data is kept in ``DATA_DIR/kafka`` across
   runs);
2. every topic of :class:`~eroica.kafka.config.KafkaConfig`, with
   the configured partition count;
3. child processes ``python -m eroica.streams.faust summariser``, ``...
   detector`` (the stream workers, when installed) and ``python -m
   eroica.sinks.clickhouse`` (the sink): each layer's own entry point, never
   the CLI; each with a free 127.0.0.1 web port, its own data directory,
   its log file and its Prometheus metrics port (below);

then writes ``stack.json`` (see :mod:`eroica.runtime.state`) and
``prometheus-targets.json``.

Metrics: each child serves its own series (see :mod:`eroica.runtime.metrics`)
on a port the supervisor gives it in ``EROICA_METRICS_PORT``, chosen once and
kept across the child's restarts. ``metrics_port_base`` (``eroica up
--metrics-port-base``, ``$EROICA_METRICS_PORT_BASE``) fixes them, stable across
stacks too: base + the role's offset (sink +0, detector +1, summariser +10,
summariser-N +9+N; :func:`~eroica.runtime.metrics.role_port`). Unset, they
are free ports picked at start, so that stacks started side by side (tests,
two users on one machine) never collide; Prometheus finds them either way in
``DATA_DIR/prometheus-targets.json``, a ``file_sd_configs`` targets file
(``[{"targets": ["127.0.0.1:PORT"], "labels": {"role": "sink", "service":
"sink"}}, ...]``) written at start, rewritten when an ``eroica alert`` sharing
the data directory announces its metrics (``DATA_DIR/metrics.json``, role
``alert``), and removed at a clean stop (a stopped stack is not "down").
``$EROICA_METRICS_PORT=off`` turns the children's metrics off (empty file). Children run in
their own sessions, so a Ctrl-C reaches only the supervisor, which stops them
in dependency order (workers, then the sink so it drains what they emitted,
then the broker): SIGTERM, a deadline, then SIGKILL of the child's process
group. Each child also gets ``PR_SET_PDEATHSIG`` so that it is terminated if
the supervisor itself is killed.

Supervision: :meth:`LocalStack.supervise_once` reports a child that exited
and, under the default policy, restarts it after an exponential backoff
(``backoff_s``, doubling, at most ``backoff_max_s``). The budget is
``max_restarts`` restarts per ``restart_window_s`` (10 min) *sliding window*:
a child that ran stable for a window has its whole budget back, so a crash
days later is restarted like the first one; a child that crashes more often
than that is left ``failed`` until its oldest restart leaves the window, and
then tried again. All times come from ``clock`` (injectable: tests simulate
hours without sleeping).

The embedded broker is supervised too, with the same budget: when it dies it
is started again on the same port (the children's bootstrap address stays
valid) and the topics are created again. tansu keeps everything in memory, so
its restart loses every message, consumer group and committed offset: the
workers and the sink are then restarted as well, so that they start over on
the empty topics rather than hold positions and state for data that no longer
exists. Apache Kafka keeps its data directory; its clients reconnect by
themselves and the children are left running.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import socket
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from eroica.kafka.admin import LARGE_MESSAGES, BrokerError, create_topics, wait_for_broker
from eroica.kafka.config import KafkaConfig
from eroica.runtime.backoff import delay as backoff_delay
from eroica.runtime.state import read_state, remove_state, write_state
from eroica.runtime.system import cmdline, free_port, pid_alive
from eroica.runtime import metrics as _metrics

from .apache_kafka import KAFKA_VERSION, KafkaCluster
from .tansu import TansuBroker

Clock = Callable[[], float]

__all__ = ["BROKERS", "LocalStack", "Service", "StackError", "service_role", "worker_command_available", "WORKERS",
           "TARGETS_FILE"]

TARGETS_FILE = "prometheus-targets.json"  # in the data directory: Prometheus file_sd_configs format
_TARGETS_REFRESH_S = 2.0  # how often supervise_once looks for an announced `eroica alert`

WORKERS: tuple[str, ...] = ("summariser", "detector")
BROKERS: tuple[str, ...] = ("tansu", "kafka")
# What a broker process's command line holds (to reap one a killed supervisor left behind).
_BROKER_MARKERS = (b"tansu", b"kafka.Kafka")
_PR_SET_PDEATHSIG = 1


class StackError(RuntimeError):
    """The stack could not start (broker, topics, a child that dies at once)."""


# Each child's entry point: a module run with ``python -m`` (the layer that owns the process).
CHILD_MODULES: dict[str, str] = {"summariser": "eroica.streams.faust", "detector": "eroica.streams.faust",
                                 "sink": "eroica.sinks.clickhouse"}


def service_role(name: str) -> str:
    """The role a service runs: ``summariser-2`` runs ``summariser`` (one of several in its group)."""
    role, _, index = name.rpartition("-")
    return role if role in CHILD_MODULES and index.isdigit() else name


def worker_command_available() -> bool:
    """Whether the stream workers (``python -m eroica.streams.faust``, the faust processors) are installed."""
    return importlib.util.find_spec(CHILD_MODULES["summariser"] + ".__main__") is not None


def _bindable(host: str, port: int) -> bool:
    """Whether a listener could bind ``host:port`` now (SO_REUSEADDR, as the metrics server sets it)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """Ask Linux to SIGTERM this child when the supervisor dies (no orphans after a SIGKILL)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


@dataclass
class Service:
    """One supervised child process."""

    name: str
    argv: list[str]
    env: dict[str, str]
    port: int
    health_url: str
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0  # over the stack's life (reported)
    exit_code: int | None = None
    state: str = "new"  # running, restarting, failed, stopped
    restart_at: float | None = None  # restarting: when; failed: when the budget is back (None: never)
    started_at: float = 0.0
    restart_times: list[float] = field(default_factory=list)  # clock times of recent restarts (the window)
    metrics_port: int | None = None  # its EROICA_METRICS_PORT (None: metrics off or not ours to set)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self, now: float | None = None) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log: IO[bytes]
        with open(self.log_path, "ab") as log:
            log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting {' '.join(self.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        self.state, self.exit_code, self.restart_at = "running", None, None
        self.started_at = time.monotonic() if now is None else now

    def signal_group(self, sig: int, *, even_if_exited: bool = False) -> None:
        """Signal the child's whole process group (it leads its own session).

        ``even_if_exited`` reaches processes the child left behind in its group;
        the group id cannot be reused while any of them lives.
        """
        if self.proc is None or (self.proc.poll() is not None and not even_if_exited):
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def log_tail(self, lines: int = 8) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def describe(self) -> dict[str, Any]:
        return {"pid": self.pid, "port": self.port, "health_url": self.health_url, "state": self.state,
                "restarts": self.restarts, "recent_restarts": len(self.restart_times),
                "exit_code": self.exit_code, "log": str(self.log_path), "argv": self.argv,
                "metrics_port": self.metrics_port}


@dataclass
class RestartPolicy:
    """``max_restarts`` per sliding ``window_s``, exponential backoff between them.

    ``decide(restart_times, now)`` -> (delay, None) to restart after ``delay``
    seconds, or (None, when) when the budget is spent until ``when`` (the
    oldest restart leaving the window). Restarts older than the window are
    forgotten first: a child that ran stable for a window has its budget back.
    """

    max_restarts: int = 3
    window_s: float = 600.0
    backoff_s: float = 1.0
    backoff_max_s: float = 60.0

    def prune(self, restart_times: list[float], now: float) -> None:
        restart_times[:] = [t for t in restart_times if now - t < self.window_s]

    def decide(self, restart_times: list[float], now: float) -> tuple[float | None, float | None]:
        self.prune(restart_times, now)
        n = len(restart_times)
        if n < self.max_restarts:
            return backoff_delay(n + 1, self.backoff_s, self.backoff_max_s), None  # n restarts so far
        return None, (restart_times[0] + self.window_s if restart_times else None)


@dataclass
class LocalStack:
    """Broker + workers + sink under one supervisor (see the module docstring).

    ``kafka``: external bootstrap (no broker started). ``broker_kind``: which one
    to start otherwise, ``tansu`` or ``kafka`` (Apache Kafka). ``clickhouse_url``: a
    ClickHouse server for the sink; default chdb in ``data_dir/chdb``.
    ``workers``: which ``eroica worker`` roles to run (skipped, with a
    message, when the command is not installed). ``summarisers``: how many
    summariser processes (``summariser``, ``summariser-2``, ...): one
    consumer group, the raw topic's partitions shared among them by Kafka's
    rebalancing, each with its own data directory and port. A summariser is
    one Python process, so a job whose raw rate needs more than a core needs
    more of them. ``env``: the base environment of the children (default:
    this process's). ``metrics_port_base``: fixed metrics ports (see the
    module docstring); None: free ports.
    """

    data_dir: Path
    kafka: str | None = None
    broker_kind: str = "tansu"
    clickhouse_url: str | None = None
    workers: Sequence[str] = WORKERS
    summarisers: int = 1
    restart: bool = True
    max_restarts: int = 3
    restart_window_s: float = 600.0
    backoff_s: float = 1.0
    backoff_max_s: float = 60.0
    clock: Clock = time.monotonic
    stop_timeout_s: float = 10.0
    env: Mapping[str, str] | None = None
    metrics_port_base: int | None = None
    python: str = sys.executable
    on_event: Callable[[str], None] = lambda msg: print(f"eroica up: {msg}", file=sys.stderr, flush=True)
    services: dict[str, Service] = field(default_factory=dict)
    broker: TansuBroker | KafkaCluster | None = None
    bootstrap: str = ""
    started_at_ns: int = 0
    broker_restarts: int = 0
    broker_restart_times: list[float] = field(default_factory=list)
    broker_restart_at: float | None = None
    broker_port: int | None = None
    broker_state: str = "running"  # running, restarting, failed (managed broker only)
    _stopping: bool = False
    _targets: list[dict[str, Any]] | None = None  # as last written to TARGETS_FILE
    _targets_checked_at: float = float("-inf")

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir).expanduser().resolve()
        if self.broker_kind not in BROKERS:
            raise ValueError(f"broker must be one of {', '.join(BROKERS)}, got {self.broker_kind!r}")
        if self.summarisers < 1:
            raise ValueError(f"summarisers must be at least 1, got {self.summarisers}")
        if self.metrics_port_base is not None:
            top = self.metrics_port_base + _metrics.ROLE_PORT_OFFSETS["summariser"] + self.summarisers - 1
            if self.metrics_port_base < 1 or top > 65535 or self.summarisers > _metrics.MAX_INSTANCES:
                raise ValueError(f"metrics port base {self.metrics_port_base} with {self.summarisers} "
                                 f"summariser(s) needs ports up to {top}: use 1..{65535 - 99}, at most "
                                 f"{_metrics.MAX_INSTANCES} summarisers")

    # -- derived ----------------------------------------------------------------------
    @property
    def policy(self) -> RestartPolicy:
        return RestartPolicy(self.max_restarts, self.restart_window_s, self.backoff_s, self.backoff_max_s)

    @property
    def sink_clickhouse_url(self) -> str:
        return self.clickhouse_url or f"chdb://{self.data_dir / 'chdb'}"

    @property
    def query_endpoint(self) -> str | None:
        sink = self.services.get("sink")
        return f"http://127.0.0.1:{sink.port}" if sink is not None else None

    def kafka_config(self) -> KafkaConfig:
        base = os.environ if self.env is None else self.env
        return KafkaConfig.from_env(base, bootstrap=self.bootstrap or self.kafka)

    # -- start --------------------------------------------------------------------------
    def start(self, ready_timeout_s: float = 60.0) -> LocalStack:
        """Start everything and wait until each part answers; StackError (after cleanup) if not."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.started_at_ns = time.time_ns()
        self._reap_stale()
        try:
            self._start_broker()
            self._create_topics()
            for spec in self._service_specs():
                self.services[spec.name] = spec
                spec.start(self.clock())
                self.on_event(f"started {spec.name} (pid {spec.pid}, port {spec.port}, metrics port "
                              f"{spec.metrics_port or 'off'}, log {spec.log_path})")
            self.write_state()
            self.write_targets()
            self.wait_ready(ready_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _reap_stale(self) -> None:
        """Stop what a previous supervisor, killed outright, left behind (its broker has no PDEATHSIG).

        Only processes recorded in the stale ``stack.json`` whose command line
        is still ours (the broker, a child's module) are touched.
        """
        old = read_state(self.data_dir)
        if old is None or pid_alive(int(old.get("pid", 0))):
            return
        candidates: list[tuple[Any, tuple[bytes, ...]]] = [(old.get("kafka", {}).get("pid"), _BROKER_MARKERS)]
        ours = (*sorted({m.encode() for m in CHILD_MODULES.values()}), b"eroica.cli")  # eroica.cli: older stacks
        candidates += [(svc.get("pid"), ours) for svc in old.get("services", {}).values()]
        reaped = 0
        for pid, markers in candidates:
            if not pid or not pid_alive(int(pid)):
                continue
            args = cmdline(int(pid))
            if args is None:
                continue
            if any(m in args for m in markers):
                try:
                    os.kill(int(pid), signal.SIGKILL)
                    reaped += 1
                except (ProcessLookupError, PermissionError):
                    pass
        if reaped:
            self.on_event(f"stopped {reaped} process(es) left by a previous stack that was killed")
        remove_state(self.data_dir)

    def _start_broker(self) -> None:
        if self.kafka:
            try:
                wait_for_broker(self.kafka_config(), timeout_s=15)
            except BrokerError as exc:
                raise StackError(f"Kafka at {self.kafka} does not answer: {exc}") from exc
            self.bootstrap = self.kafka
            return
        if self.broker_kind == "kafka":
            try:
                self.broker = KafkaCluster(1, data_dir=self.data_dir / "kafka").start()
            except BrokerError as exc:
                raise StackError(str(exc)) from exc
            self.bootstrap = self.broker.bootstrap
            self.on_event(f"started Apache Kafka {KAFKA_VERSION} (KRaft, one node) on {self.bootstrap} in "
                          f"{self.broker.start_seconds:.1f} s; data in {self.data_dir / 'kafka'}")
            return
        self.broker = TansuBroker(data_dir=self.data_dir / "tansu", port=self.broker_port).start()
        self.bootstrap, self.broker_port = self.broker.bootstrap, self.broker.port
        self.on_event(f"started tansu broker on {self.bootstrap} (memory storage: lost if it stops)")

    def _create_topics(self) -> None:
        try:
            kafka = self.kafka_config()
            create_topics(kafka, kafka.topics(), config=self.topic_config())
        except BrokerError as exc:
            raise StackError(str(exc)) from exc

    def topic_config(self) -> dict[str, str] | None:
        """Retention of the topics of a broker we run (None for an external one: its operator decides).

        ``EROICA_KAFKA_RETENTION_MS`` (default 6 h) and ``EROICA_KAFKA_RETENTION_BYTES``
        (per partition, default 256 MiB). Apache Kafka enforces both; tansu 0.6.0
        stores them (DescribeConfigs returns them) but does not enforce them on its
        memory storage, see stack/tansu.py.
        """
        if self.kafka:
            return None
        base = os.environ if self.env is None else self.env
        return {"retention.ms": str(int(base.get("EROICA_KAFKA_RETENTION_MS") or 6 * 3600 * 1000)),
                "retention.bytes": str(int(base.get("EROICA_KAFKA_RETENTION_BYTES") or 256 * 1024 * 1024)),
                **LARGE_MESSAGES}

    def _child_env(self, name: str, port: int, metrics_port: int | None) -> dict[str, str]:
        env = dict(os.environ if self.env is None else self.env)
        env.update({
            "EROICA_KAFKA_BOOTSTRAP": self.bootstrap,
            "EROICA_DATA_DIR": str(self.data_dir / name),
            "EROICA_WEB_PORT": str(port),
            "EROICA_METRICS_PORT": "off" if metrics_port is None else str(metrics_port),
            "PYTHONUNBUFFERED": "1",
        })
        if name == "sink":
            env["EROICA_CLICKHOUSE_URL"] = self.sink_clickhouse_url
            env["EROICA_SINK_HTTP_PORT"] = str(port)
        return env

    def _service_specs(self) -> list[Service]:
        roles = list(self.workers)
        if roles and not worker_command_available():
            self.on_event(f"`eroica worker` is not installed in this version: not starting {', '.join(roles)}")
            roles = []
        names = []
        for role in roles:
            names.append(role)
            if role == "summariser":
                names += [f"summariser-{i}" for i in range(2, self.summarisers + 1)]
        specs = []
        names.append("sink")
        taken: set[int] = set()
        metrics_ports = self._metrics_ports(names, taken)
        for name in names:
            role = service_role(name)
            port = free_port()
            while port in taken:
                port = free_port()
            taken.add(port)
            (self.data_dir / name).mkdir(parents=True, exist_ok=True)
            argv = [self.python, "-m", CHILD_MODULES[role], *((role,) if role != "sink" else ())]
            # faust's web server (streams/faust/settings.py) serves /eroica/stats; the sink /health
            path = "/health" if name == "sink" else "/eroica/stats"
            specs.append(Service(name, argv, self._child_env(name, port, metrics_ports[name]), port,
                                 f"http://127.0.0.1:{port}{path}", self.data_dir / "logs" / f"{name}.log",
                                 metrics_port=metrics_ports[name]))
        return specs

    def _metrics_ports(self, names: Sequence[str], taken: set[int]) -> dict[str, int | None]:
        """Each service's metrics port (added to ``taken``): fixed under ``metrics_port_base``, else free.

        A fixed port that something else holds is a StackError now, rather than
        a child running without metrics (it would log it and carry on).
        """
        base_env = os.environ if self.env is None else self.env
        try:
            if _metrics.metrics_port(base_env) is None:  # EROICA_METRICS_PORT=off for the whole stack
                return dict.fromkeys(names)
        except ValueError:
            pass  # a port number meant for one process: each child gets its own below
        ports: dict[str, int | None] = {}
        for name in names:
            if self.metrics_port_base is not None:
                port = _metrics.role_port(self.metrics_port_base, name)
                assert port is not None  # names are known roles; __post_init__ checked the range
                if not _bindable(self._metrics_host(), port):
                    raise StackError(f"metrics port {port} of {name} (base {self.metrics_port_base}) is in use: "
                                     f"stop what holds it or choose another --metrics-port-base")
            else:
                port = free_port()
                while port in taken:
                    port = free_port()
            taken.add(port)
            ports[name] = port
        return ports

    def _metrics_host(self) -> str:
        """The address in the targets (the children's EROICA_METRICS_ADDR; a wildcard is scraped on loopback)."""
        addr = (os.environ if self.env is None else self.env).get("EROICA_METRICS_ADDR") or "127.0.0.1"
        return "127.0.0.1" if addr in ("0.0.0.0", "::", "") else addr

    # -- Prometheus file_sd ---------------------------------------------------------------
    def targets(self) -> list[dict[str, Any]]:
        """The ``file_sd_configs`` groups: one per child with a metrics port, plus an announced ``eroica alert``."""
        host = self._metrics_host()
        groups = [{"targets": [f"{host}:{svc.metrics_port}"], "labels": {"role": service_role(name), "service": name}}
                  for name, svc in self.services.items() if svc.metrics_port is not None]
        seen: dict[str, int] = {}
        for ann in _metrics.read_announcements(self.data_dir):  # every live one, oldest first: alert, alert-2, ...
            netloc = str(ann["url"]).split("://", 1)[-1].split("/", 1)[0]
            component = str(ann.get("component") or "process")
            seen[component] = seen.get(component, 0) + 1
            service = component if seen[component] == 1 else f"{component}-{seen[component]}"
            groups.append({"targets": [netloc], "labels": {"role": component, "service": service}})
        return groups

    def write_targets(self) -> None:
        """Write ``DATA_DIR/prometheus-targets.json`` atomically when its content changed.

        Prometheus watches the file and rereads it on a rename, so a reader never
        sees half of it.
        """
        groups = self.targets()
        if groups == self._targets:
            return
        path = self.data_dir / TARGETS_FILE
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(groups, indent=1) + "\n")
        os.replace(tmp, path)
        self._targets = groups

    def wait_ready(self, timeout_s: float) -> None:
        """Wait until every child answers on its port; StackError naming the ones that do not."""
        from .health import http_ok

        deadline = time.monotonic() + timeout_s
        pending = dict(self.services)
        while pending and time.monotonic() < deadline:
            for name, svc in list(pending.items()):
                if svc.proc is not None and svc.proc.poll() is not None:
                    raise StackError(f"{name} exited with status {svc.proc.returncode} at start; log "
                                     f"{svc.log_path}:\n{svc.log_tail()}")
                ok, info = http_ok(svc.health_url, timeout_s=1.0)
                # The sink is ready once it holds its partitions (a group join takes seconds on tansu).
                if ok and (name != "sink" or (isinstance(info, dict) and info.get("assigned"))):
                    del pending[name]
            if pending:
                time.sleep(0.2)
        if pending:
            raise StackError(f"not ready within {timeout_s:.0f} s: {', '.join(pending)} "
                             f"(logs in {self.data_dir / 'logs'})")

    # -- supervision --------------------------------------------------------------------
    def supervise_once(self) -> None:
        """Notice exited children (and a dead broker); restart them under the policy. Call it every ~0.5 s."""
        if self._stopping:
            return
        now = self.clock()
        changed = self._supervise_broker(now)
        for svc in self.services.values():
            changed |= self._supervise_service(svc, now)
        if changed:
            self.write_state()
        if now - self._targets_checked_at >= _TARGETS_REFRESH_S:
            self._targets_checked_at = now
            try:
                self.write_targets()
            except OSError as exc:
                self.on_event(f"cannot write {self.data_dir / TARGETS_FILE}: {exc}")

    def _supervise_service(self, svc: Service, now: float) -> bool:
        policy = self.policy
        if svc.state == "running" and svc.proc is not None and svc.proc.poll() is not None:
            svc.exit_code = svc.proc.returncode
            tail = svc.log_tail(5)
            ran = now - svc.started_at
            delay, back_at = policy.decide(svc.restart_times, now) if self.restart else (None, None)
            if delay is not None:
                svc.state, svc.restart_at = "restarting", now + delay
                self.on_event(f"{svc.name} (pid {svc.pid}) exited with status {svc.exit_code} after {ran:.0f} s; "
                              f"restarting in {delay:.0f} s ({len(svc.restart_times) + 1}/{self.max_restarts} "
                              f"in {self.restart_window_s:.0f} s); log tail:\n{tail}")
            else:
                svc.state, svc.restart_at = "failed", back_at
                when = (f"; tried again in {back_at - now:.0f} s, when its restart budget is back"
                        if back_at is not None else "")
                self.on_event(f"{svc.name} (pid {svc.pid}) exited with status {svc.exit_code}; not "
                              f"restarted ({self.max_restarts} restarts in {self.restart_window_s:.0f} s){when}; "
                              f"log {svc.log_path}:\n{tail}")
            return True
        if svc.state == "restarting" and svc.restart_at is not None and now >= svc.restart_at:
            self._restart_service(svc, now)
            self.on_event(f"restarted {svc.name} (pid {svc.pid})")
            return True
        if svc.state == "failed" and self.restart and svc.restart_at is not None and now >= svc.restart_at:
            policy.prune(svc.restart_times, now)
            self._restart_service(svc, now)
            self.on_event(f"restarted {svc.name} (pid {svc.pid}): its restart budget is back")
            return True
        return False

    def _restart_service(self, svc: Service, now: float) -> None:
        svc.signal_group(signal.SIGKILL, even_if_exited=True)  # nothing of the last run may linger
        svc.restarts += 1
        svc.restart_times.append(now)
        svc.start(now)

    def _broker_log(self) -> Path | None:
        if isinstance(self.broker, KafkaCluster):
            return self.broker.nodes[0].log_path if self.broker.nodes else None
        if isinstance(self.broker, TansuBroker):
            return self.broker.log_path
        return None

    def _supervise_broker(self, now: float) -> bool:
        """Restart a managed broker that died (same port); True when something changed."""
        if self.broker is None or self.kafka:
            return False
        if self.broker_state == "running":
            if self.broker.running:
                return False
            kind = "Apache Kafka" if isinstance(self.broker, KafkaCluster) else "tansu"
            delay, back_at = (self.policy.decide(self.broker_restart_times, now) if self.restart
                              else (None, None))
            if delay is None:
                self.broker_state, self.broker_restart_at = "failed", back_at
                self.on_event(f"the {kind} broker exited (log {self._broker_log()}); not restarted "
                              f"({'--no-restart' if not self.restart else 'restart budget spent'}): "
                              f"restart the stack")
            else:
                self.broker_state, self.broker_restart_at = "restarting", now + delay
                lost = ("its topics were in memory and are lost (the messages on them, consumer groups, "
                        "committed offsets)" if kind == "tansu" else
                        f"its data is kept in {self.data_dir / 'kafka'}")
                self.on_event(f"the {kind} broker exited (log {self._broker_log()}); {lost}; restarting it on "
                              f"{self.bootstrap} in {delay:.0f} s")
            return True
        if self.broker_state in ("restarting", "failed") and self.broker_restart_at is not None \
                and now >= self.broker_restart_at and (self.restart or self.broker_state == "restarting"):
            self.policy.prune(self.broker_restart_times, now)
            self.broker_restarts += 1
            self.broker_restart_times.append(now)
            try:
                self._restart_broker()
            except (BrokerError, StackError) as exc:
                delay, back_at = self.policy.decide(self.broker_restart_times, self.clock())
                if delay is None:
                    self.broker_state, self.broker_restart_at = "failed", back_at
                else:
                    self.broker_state, self.broker_restart_at = "restarting", self.clock() + delay
                self.on_event(f"restarting the broker failed: {exc}")
                return True
            self.broker_state, self.broker_restart_at = "running", None
            return True
        return False

    def _restart_broker(self) -> None:
        assert self.broker is not None
        if isinstance(self.broker, KafkaCluster):
            self.broker.restart(0)
            self._create_topics()
            self.on_event(f"restarted Apache Kafka on {self.bootstrap} (data kept); the workers and the sink "
                          f"reconnect by themselves")
            return
        self.broker.stop()
        self._start_broker()
        self._create_topics()
        self.on_event(f"restarted tansu on {self.bootstrap}: it starts empty (memory storage), so everything "
                      f"that was on its topics is lost; restarting the workers and the sink so they start over "
                      f"on the empty topics")
        now = self.clock()
        for svc in self.services.values():
            if svc.state in ("running", "restarting"):
                # Not counted against the child's budget: the broker, not the child, failed.
                svc.signal_group(signal.SIGKILL, even_if_exited=True)
                if svc.proc is not None:
                    try:
                        svc.proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        pass
                svc.start(now)
                self.on_event(f"restarted {svc.name} (pid {svc.pid}) after the broker restart")

    @property
    def healthy(self) -> bool:
        broker_ok = self.broker is None or self.broker_state == "running"
        return broker_ok and all(s.state == "running" for s in self.services.values())

    # -- state --------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        if isinstance(self.broker, KafkaCluster):
            broker_pid = self.broker.pids[0] if self.broker.nodes else None
        else:
            broker_pid = getattr(getattr(self.broker, "_proc", None), "pid", None)
        url = self.sink_clickhouse_url
        return {
            "pid": os.getpid(),
            "started_at_ns": self.started_at_ns,
            "data_dir": str(self.data_dir),
            "kafka": {"bootstrap": self.bootstrap, "managed": self.broker is not None or not self.kafka,
                      "pid": broker_pid, "kind": None if self.kafka else self.broker_kind,
                      "state": "external" if self.kafka else self.broker_state,
                      "restarts": self.broker_restarts},
            "clickhouse": {"url": url, "backend": "chdb" if url.startswith("chdb:") else "native"},
            "query_endpoint": self.query_endpoint,
            "services": {name: svc.describe() for name, svc in self.services.items()},
        }

    def write_state(self) -> None:
        write_state(self.data_dir, self.describe())

    # -- stop ---------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop workers, then the sink, then the broker; SIGKILL what outlives the deadline."""
        self._stopping = True
        tiers = [[s for n, s in self.services.items() if n != "sink"],
                 [s for n, s in self.services.items() if n == "sink"]]
        for tier in tiers:
            self._stop_tier(tier)
        if self.broker is not None:
            self.broker.stop()
            self.broker = None
        remove_state(self.data_dir)
        (self.data_dir / TARGETS_FILE).unlink(missing_ok=True)
        self._targets = None

    def _stop_tier(self, tier: list[Service]) -> None:
        live = [s for s in tier if s.proc is not None and s.proc.poll() is None]
        for s in live:
            s.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        for s in live:
            assert s.proc is not None
            try:
                s.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.on_event(f"{s.name} (pid {s.pid}) did not stop within {self.stop_timeout_s:.0f} s: killed")
                s.signal_group(signal.SIGKILL)
                s.proc.wait(timeout=5)
        for s in tier:
            s.signal_group(signal.SIGKILL, even_if_exited=True)  # stragglers left in its process group
            if s.proc is not None:
                s.exit_code = s.proc.returncode
            s.state = "stopped"

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
