"""eroica.stack.clickhouse_server: a private server on loopback, stopped cleanly."""

from __future__ import annotations

from pathlib import Path

from eroica.stack.clickhouse_server import ClickHouseServer


def _listening(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp* writes them) listening on ``port``."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            addr, hexport = fields[1].rsplit(":", 1)
            if fields[3] == "0A" and int(hexport, 16) == port:  # 0A = LISTEN
                found.add(addr)
    return found


def test_session_server_is_private(clickhouse_server: ClickHouseServer) -> None:
    s = clickhouse_server
    assert s.running
    assert s.url == f"clickhouse://127.0.0.1:{s.native_port}/default"
    assert s.native_port != s.http_port
    for port in (s.native_port, s.http_port):
        assert _listening(port) == {"0100007F"}  # 127.0.0.1 only
    assert s.work_dir is not None
    config = (s.work_dir / "config.xml").read_text()
    assert config.count("<listen_host>") == 1 and "<listen_host>127.0.0.1</listen_host>" in config
    assert "/var/lib/clickhouse" not in config and str(s.work_dir.resolve()) in config
    assert (s.work_dir / "log" / "clickhouse-server.log").exists()


def test_context_manager_stops_and_cleans_up(clickhouse_server_binary: list[str]) -> None:
    from clickhouse_driver import Client

    with ClickHouseServer() as server:
        work_dir, port = server.work_dir, server.native_port
        client = Client(host="127.0.0.1", port=port)
        assert client.execute("SELECT 1") == [(1,)]  # left connected on purpose
    assert not server.running
    assert work_dir is not None and not work_dir.exists()
    assert _listening(port) == set()
    client.disconnect()
