"""The local tansu broker starts, answers Kafka requests, creates topics and always stops."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from eroica.kafka.admin import BrokerError, create_topics
from eroica.runtime.system import free_port
from eroica.stack.tansu import TansuBroker, _quiet_admin, tansu_binary


def _broker_or_skip(**kw) -> TansuBroker:
    """A broker to start; without the binary: skipped locally, failed in CI (like kafka_bootstrap)."""
    try:
        tansu_binary()
    except BrokerError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"tansu binary missing in CI: {exc}")
        pytest.skip(str(exc))
    return TansuBroker(**kw)


def test_start_create_topics_and_stop(tmp_path) -> None:
    port = free_port()
    with _broker_or_skip(data_dir=tmp_path, port=port) as broker:
        assert broker.bootstrap == f"127.0.0.1:{port}" and broker.running
        create_topics(broker.bootstrap, {"a": 3, "b": 1})
        create_topics(broker.bootstrap, {"a": 3})  # already there: fine
        md = _quiet_admin(broker.bootstrap).list_topics(timeout=5)
        assert {t: len(md.topics[t].partitions) for t in ("a", "b")} == {"a": 3, "b": 1}
        assert "listening on: tcp://127.0.0.1" in (tmp_path / "tansu.log").read_text()
    assert not broker.running
    with socket.socket() as s:  # the port is free again (SO_REUSEADDR: server sockets linger in TIME_WAIT)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def test_stop_kills_a_broker_that_ignores_sigterm() -> None:
    # tansu may wait on open client connections after SIGTERM; a stopped
    # process stands in for that deterministically (SIGTERM stays pending).
    broker = _broker_or_skip().start()
    proc = broker._proc
    os.kill(proc.pid, signal.SIGSTOP)
    start = time.monotonic()
    broker.stop(timeout_s=0.5)
    assert 0.5 <= time.monotonic() - start < 3
    assert not broker.running and proc.returncode == -signal.SIGKILL


def test_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        broker = _broker_or_skip(port=s.getsockname()[1], start_timeout_s=5)
        with pytest.raises(BrokerError, match="Address in use|did not answer"):
            broker.start()
        assert not broker.running
