"""Start a private ClickHouse server for tests and local runs.

Why by hand and not through systemd or the package's service: CI containers
have no init system, tests must not touch a system-wide server or its data in
/var/lib/clickhouse, and several test runs may share one machine. So each
:class:`ClickHouseServer` writes its own ``config.xml``/``users.xml`` into a
private directory, listens on 127.0.0.1 only, on ports picked free at start, and
keeps its data and logs under that directory.

The config uses the ``<yandex>`` root element, which every server version reads
(Debian bookworm ships 18.16; current releases still accept it).

:class:`ClickHouseShards` starts several such servers whose configs all name
one ``remote_servers`` cluster of them (one replica per shard, no ZooKeeper):
the sharded deployment the sink writes through a ``Distributed`` table
(``sinks/clickhouse/schema.py``, ``EROICA_CLICKHOUSE_CLUSTER``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from xml.sax.saxutils import escape

__all__ = ["ClickHouseServer", "ClickHouseShards", "ClickHouseServerError", "find_server_binary"]

# Debian installs the server in /usr/sbin (not on a normal user's PATH); the
# upstream packages install one multi-call binary, /usr/bin/clickhouse.
_CANDIDATES: tuple[tuple[str, ...], ...] = (
    ("/usr/sbin/clickhouse-server",),
    ("/usr/bin/clickhouse-server",),
    ("/usr/bin/clickhouse", "server"),
)


class ClickHouseServerError(RuntimeError):
    """The server binary is missing, or the server did not come up."""


def find_server_binary() -> list[str] | None:
    """Return the argv prefix that starts a server, or None when none is installed.

    ``EROICA_CLICKHOUSE_SERVER_BIN`` overrides the search (a path to either a
    ``clickhouse-server`` binary or the multi-call ``clickhouse`` binary).
    """
    override = os.environ.get("EROICA_CLICKHOUSE_SERVER_BIN")
    if override:
        path = Path(override)
        if not (path.is_file() and os.access(path, os.X_OK)):
            return None
        return [str(path), "server"] if path.name == "clickhouse" else [str(path)]
    on_path = shutil.which("clickhouse-server")
    if on_path:
        return [on_path]
    for argv in _CANDIDATES:
        if os.access(argv[0], os.X_OK):
            return list(argv)
    multi = shutil.which("clickhouse")
    if multi:
        return [multi, "server"]
    return None


def _free_port() -> int:
    """A port the kernel says is free now (a small race remains; start() retries)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_open(port: int) -> bool:
    """A plain TCP probe first, so the driver does not log a traceback per early poll."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


_CONFIG = """<?xml version="1.0"?>
<yandex>
    <logger>
        <level>{log_level}</level>
        <log>{root}/log/clickhouse-server.log</log>
        <errorlog>{root}/log/clickhouse-server.err.log</errorlog>
        <size>100M</size>
        <count>2</count>
    </logger>
    <listen_host>127.0.0.1</listen_host>
    <tcp_port>{native_port}</tcp_port>
    <http_port>{http_port}</http_port>
    <path>{root}/data/</path>
    <tmp_path>{root}/tmp/</tmp_path>
    <user_files_path>{root}/user_files/</user_files_path>
    <format_schema_path>{root}/format_schemas/</format_schema_path>
    <users_config>{root}/users.xml</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <timezone>UTC</timezone>
    <max_connections>256</max_connections>
    <keep_alive_timeout>3</keep_alive_timeout>
    <max_concurrent_queries>64</max_concurrent_queries>
    <uncompressed_cache_size>67108864</uncompressed_cache_size>
    <mark_cache_size>67108864</mark_cache_size>
    <mlock_executable>false</mlock_executable>
    <builtin_dictionaries_reload_interval>3600</builtin_dictionaries_reload_interval>
    <max_session_timeout>3600</max_session_timeout>
    <default_session_timeout>60</default_session_timeout>
{remote_servers}</yandex>
"""

_USERS = """<?xml version="1.0"?>
<yandex>
    <profiles>
        <default>
            <max_memory_usage>2000000000</max_memory_usage>
            <use_uncompressed_cache>0</use_uncompressed_cache>
            <load_balancing>random</load_balancing>
            <!-- Idle connections notice a shutdown within 1 s (default 10 s). -->
            <poll_interval>1</poll_interval>
        </default>
        <readonly>
            <readonly>1</readonly>
        </readonly>
    </profiles>
    <users>
        <default>
            <password></password>
            <networks>
                <ip>127.0.0.1</ip>
            </networks>
            <profile>default</profile>
            <quota>default</quota>
        </default>
    </users>
    <quotas>
        <default>
            <interval>
                <duration>3600</duration>
                <queries>0</queries>
                <errors>0</errors>
                <result_rows>0</result_rows>
                <read_rows>0</read_rows>
                <execution_time>0</execution_time>
            </interval>
        </default>
    </quotas>
</yandex>
"""


def _remote_servers_xml(clusters: dict[str, list[tuple[str, int]]]) -> str:
    """``<remote_servers>``: each cluster a list of shards of one replica each (host, native port)."""
    if not clusters:
        return ""
    out = ["    <remote_servers>\n"]
    for name, shards in clusters.items():
        if not name.replace("_", "a").isalnum() or not name.isascii() or name[0].isdigit():
            raise ValueError(f"cluster name {name!r}: use letters, digits and '_' (not first)")
        out.append(f"        <{name}>\n")
        for host, port in shards:
            out.append(
                "            <shard>\n"
                "                <internal_replication>false</internal_replication>\n"
                f"                <replica><host>{escape(host)}</host><port>{int(port)}</port></replica>\n"
                "            </shard>\n"
            )
        out.append(f"        </{name}>\n")
    out.append("    </remote_servers>\n")
    return "".join(out)


class ClickHouseServer:
    """A private ``clickhouse-server`` process; use it as a context manager.

    ``work_dir``: where config, data and logs go. When None a temporary
    directory is created and removed at :meth:`stop`; a given directory is kept
    (its logs help when a test fails). ``native_port`` pins the native port
    (e.g. to start a server where a client is already retrying); by default
    both ports are picked free at start. ``remote_servers``: clusters this
    server knows, ``{name: [(host, native_port), ...]}`` (one shard per entry),
    as :class:`ClickHouseShards` sets them.
    """

    def __init__(
        self,
        work_dir: Path | None = None,
        *,
        startup_timeout_s: float = 60.0,
        stop_timeout_s: float = 10.0,
        log_level: str = "information",
        native_port: int | None = None,
        remote_servers: dict[str, list[tuple[str, int]]] | None = None,
    ) -> None:
        self._remote_servers_xml = _remote_servers_xml(remote_servers or {})
        self._given_dir = Path(work_dir) if work_dir is not None else None
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.log_level = log_level
        self.work_dir: Path | None = None
        self._fixed_native_port = native_port
        self.native_port: int = native_port or 0
        self.http_port: int = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._owns_dir = False

    # -- public -----------------------------------------------------------
    @property
    def url(self) -> str:
        """``clickhouse://127.0.0.1:PORT/default``, the form ClickHouseConfig reads."""
        return f"clickhouse://127.0.0.1:{self.native_port}/default"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_path(self) -> Path | None:
        return self.work_dir / "log" / "clickhouse-server.err.log" if self.work_dir else None

    def start(self) -> ClickHouseServer:
        """Write the config, start the binary, and wait until ``SELECT 1`` answers.

        Retries with new ports when the server dies at start (another process
        took a port between our probe and its bind).
        """
        if self.running:
            return self
        argv = find_server_binary()
        if argv is None:
            raise ClickHouseServerError(
                "clickhouse-server not found (looked on PATH, /usr/sbin/clickhouse-server, "
                "/usr/bin/clickhouse-server, /usr/bin/clickhouse); run .ci/install-clickhouse.sh"
            )
        self._prepare_dir()
        last_error = ""
        for _attempt in range(3):
            self.native_port = self._fixed_native_port or _free_port()
            self.http_port = _free_port()
            while self.http_port == self.native_port:
                self.http_port = _free_port()
            self._write_config()
            assert self.work_dir is not None
            stdout = open(self.work_dir / "log" / "stdout.log", "ab")
            try:
                self._proc = subprocess.Popen(
                    [*argv, f"--config-file={self.work_dir / 'config.xml'}"],
                    cwd=self.work_dir,
                    stdin=subprocess.DEVNULL,
                    stdout=stdout,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # a Ctrl-C on pytest must not hit it first
                )
            finally:
                stdout.close()
            try:
                self._wait_ready()
                return self
            except ClickHouseServerError as exc:
                last_error = str(exc)
                self._terminate()
                if self._fixed_native_port or "address already in use" not in self._log_tail().lower():
                    break
        self._cleanup_dir()
        raise ClickHouseServerError(last_error)

    def stop(self) -> None:
        """Terminate (SIGTERM), then kill after ``stop_timeout_s``; remove a temp dir."""
        self._terminate()
        self._cleanup_dir()

    def __enter__(self) -> ClickHouseServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- internals --------------------------------------------------------
    def _prepare_dir(self) -> None:
        if self.work_dir is None:
            if self._given_dir is not None:
                self.work_dir = self._given_dir
                self.work_dir.mkdir(parents=True, exist_ok=True)
            else:
                self.work_dir = Path(tempfile.mkdtemp(prefix="eroica-clickhouse-"))
                self._owns_dir = True
        for sub in ("data", "tmp", "user_files", "format_schemas", "log"):
            (self.work_dir / sub).mkdir(parents=True, exist_ok=True)

    def _write_config(self) -> None:
        assert self.work_dir is not None
        root = escape(str(self.work_dir.resolve()))
        (self.work_dir / "config.xml").write_text(
            _CONFIG.format(
                root=root,
                native_port=self.native_port,
                http_port=self.http_port,
                log_level=escape(self.log_level),
                remote_servers=self._remote_servers_xml,
            )
        )
        (self.work_dir / "users.xml").write_text(_USERS)

    def _wait_ready(self) -> None:
        """Poll with a native ``SELECT 1`` until it answers, the process dies, or time runs out."""
        from clickhouse_driver import Client  # imported late: only the server path needs it

        deadline = time.monotonic() + self.startup_timeout_s
        last = "native port not open yet"
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise ClickHouseServerError(
                    f"clickhouse-server exited with code {self._proc.returncode} during startup; "
                    f"log tail ({self.log_path}):\n{self._log_tail()}"
                )
            if not _port_open(self.native_port):
                time.sleep(0.05)
                continue
            client = Client(
                host="127.0.0.1", port=self.native_port, connect_timeout=1,
                send_receive_timeout=5, sync_request_timeout=5,
            )
            try:
                if client.execute("SELECT 1") == [(1,)]:
                    return
            except Exception as exc:  # noqa: BLE001 - any failure means "not yet"
                last = f"{type(exc).__name__}: {exc}"
            finally:
                client.disconnect()
            time.sleep(0.1)
        raise ClickHouseServerError(
            f"clickhouse-server did not answer SELECT 1 on 127.0.0.1:{self.native_port} within "
            f"{self.startup_timeout_s:.0f}s (last error: {last}); log tail:\n{self._log_tail()}"
        )

    def _terminate(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)

    def _cleanup_dir(self) -> None:
        if self._owns_dir and self.work_dir is not None:
            shutil.rmtree(self.work_dir, ignore_errors=True)
            self.work_dir = None
            self._owns_dir = False

    def _log_tail(self, lines: int = 30) -> str:
        if self.work_dir is None:
            return ""
        chunks = []
        for name in ("clickhouse-server.err.log", "stdout.log"):
            path = self.work_dir / "log" / name
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                chunks.append(f"--- {name}\n" + "\n".join(text))
        return "\n".join(chunks)


class ClickHouseShards:
    """``count`` private servers, each one shard of the cluster ``cluster`` in every server's config.

    Each server has its own directory (``work_dir/shard-N`` when given) and its own 127.0.0.1
    ports; the native ports are chosen before the first start, since every config names them
    all. No ZooKeeper: no ``ON CLUSTER`` DDL and no replication, so the schema is created on each
    shard by the sink (``VerdictSink.ensure_schema``). Use it as a context manager.
    """

    def __init__(self, work_dir: Path | None = None, *, count: int = 2, cluster: str = "eroica_shards",
                 startup_timeout_s: float = 60.0, stop_timeout_s: float = 10.0) -> None:
        if count < 1:
            raise ValueError("a cluster needs at least one shard")
        _remote_servers_xml({cluster: []})  # validates the name
        self.cluster = cluster
        self.count = count
        self._work_dir = Path(work_dir) if work_dir is not None else None
        self._startup_timeout_s = startup_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self.servers: list[ClickHouseServer] = []

    @property
    def urls(self) -> list[str]:
        """Each shard's ``clickhouse://127.0.0.1:PORT/default``."""
        return [s.url for s in self.servers]

    def start(self) -> ClickHouseShards:
        """Start every shard; on a port taken between the probe and the bind, all start again."""
        last: ClickHouseServerError | None = None
        for _attempt in range(3):
            ports: list[int] = []
            while len(ports) < self.count:
                p = _free_port()
                if p not in ports:
                    ports.append(p)
            layout = {self.cluster: [("127.0.0.1", p) for p in ports]}
            self.servers = [
                ClickHouseServer(
                    None if self._work_dir is None else self._work_dir / f"shard-{i + 1}",
                    native_port=p, remote_servers=layout,
                    startup_timeout_s=self._startup_timeout_s, stop_timeout_s=self._stop_timeout_s,
                )
                for i, p in enumerate(ports)
            ]
            try:
                for server in self.servers:
                    server.start()
                return self
            except ClickHouseServerError as exc:
                last = exc
                self.stop()
                if "address already in use" not in str(exc).lower():
                    break
        assert last is not None
        raise last

    def stop(self) -> None:
        """Stop every shard (each: SIGTERM, then SIGKILL after its stop timeout)."""
        for server in self.servers:
            server.stop()

    def __enter__(self) -> ClickHouseShards:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
