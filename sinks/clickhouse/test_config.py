"""ClickHouseConfig: URL forms, environment variables, validation, backoff."""

from __future__ import annotations

import pytest
from eroica.sinks.clickhouse.config import DEFAULT_URL, ClickHouseConfig, RetryPolicy


def test_native_url() -> None:
    c = ClickHouseConfig.from_url("clickhouse://alice:s%40cret@db.example:9001/metrics")
    assert (c.backend, c.host, c.port, c.user, c.password, c.database) == (
        "native", "db.example", 9001, "alice", "s@cret", "metrics")
    assert "s@cret" not in repr(c)
    assert c.verdicts == "`metrics`.`verdicts`"
    assert ClickHouseConfig.from_url("clickhouse://h").port == 9000
    assert ClickHouseConfig.from_url("clickhouse://h").database == "eroica"
    assert ClickHouseConfig.from_url("clickhouses://h/x").secure
    assert ClickHouseConfig.from_url("clickhouses://h/x").port == 9440


def test_chdb_url(tmp_path) -> None:
    c = ClickHouseConfig.from_url(f"chdb://{tmp_path}/data?database=ev")
    assert (c.backend, c.chdb_path, c.database) == ("chdb", str(tmp_path / "data"), "ev")
    assert ClickHouseConfig.from_url("chdb://:memory:").chdb_path == ":memory:"
    assert ClickHouseConfig.from_url("chdb://rel/dir").chdb_path == "rel/dir"


@pytest.mark.parametrize("url", ["http://h:8123/", "clickhouse:///db", "chdb://", "mysql://x"])
def test_bad_urls(url: str) -> None:
    with pytest.raises(ValueError):
        ClickHouseConfig.from_url(url)


@pytest.mark.parametrize("name", ["a-b", "1x", "x;drop", "a`b", "", "a b"])
def test_identifiers_are_allow_listed(name: str) -> None:
    with pytest.raises(ValueError):
        ClickHouseConfig(database=name)
    with pytest.raises(ValueError):
        ClickHouseConfig(verdicts_table=name)


def test_from_env() -> None:
    env = {
        "EROICA_CLICKHOUSE_URL": "clickhouse://ch:9000/one",
        "EROICA_CLICKHOUSE_DATABASE": "two",
        "EROICA_CLICKHOUSE_PASSWORD": "pw",
        "EROICA_CLICKHOUSE_BATCH_SIZE": "500",
        "EROICA_CLICKHOUSE_RETRY_ATTEMPTS": "3",
        "EROICA_CLICKHOUSE_RETRY_DEADLINE_S": "1.5",
        "EROICA_CLICKHOUSE_VERDICTS_TABLE": "v2",
    }
    c = ClickHouseConfig.from_env(env)
    assert (c.host, c.database, c.password, c.batch_size, c.verdicts_table) == ("ch", "two", "pw", 500, "v2")
    assert (c.retry.attempts, c.retry.deadline_s) == (3, 1.5)
    assert ClickHouseConfig.from_env({}).target == ClickHouseConfig.from_url(DEFAULT_URL).target
    with pytest.raises(ValueError, match="EROICA_CLICKHOUSE_BATCH_SIZE"):
        ClickHouseConfig.from_env({"EROICA_CLICKHOUSE_BATCH_SIZE": "many"})


def test_backoff_is_exponential_and_capped() -> None:
    p = RetryPolicy(attempts=6, initial_s=0.1, max_s=0.5, multiplier=2)
    assert [p.delay(n) for n in range(1, 6)] == pytest.approx([0.1, 0.2, 0.4, 0.5, 0.5])
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)


def test_cluster() -> None:
    assert ClickHouseConfig().cluster == ""
    c = ClickHouseConfig.from_env({"EROICA_CLICKHOUSE_URL": "clickhouse://ch/e", "EROICA_CLICKHOUSE_CLUSTER": "shards"})
    assert c.cluster == "shards"
    with pytest.raises(ValueError, match="cluster name"):
        ClickHouseConfig(cluster="a'b")
    with pytest.raises(ValueError, match="chdb has no cluster"):
        ClickHouseConfig.from_url("chdb://:memory:", cluster="shards")
