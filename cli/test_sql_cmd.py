"""``eroica sql`` / ``eroica verdicts`` on a stopped stack's chdb directory and through a live sink endpoint.

The reported bypass went through ``eroica sql`` on a stopped stack (the CLI opens
``DATA_DIR/chdb`` itself) and through the running sink's endpoint (found via
``eroica-sink.json``; the token from the file it names).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from eroica.cli.main import cli
from eroica.sinks.clickhouse import ClickHouseConfig, VerdictSink
from eroica.sinks.clickhouse.endpoint import TOKEN_FILE, ensure_token_file, remove_endpoint_file, write_endpoint_file
from eroica.sinks.clickhouse.http_api import QueryServer

pytest.importorskip("chdb")


def _stopped_stack(data_dir: Path, make_verdict) -> None:
    with VerdictSink(ClickHouseConfig.from_url(f"chdb://{data_dir / 'chdb'}")) as sink:
        sink.ensure_schema()
        sink.write_verdicts([make_verdict()])


@pytest.mark.parametrize("sql", [
    "DESCRIBE TABLE file('/etc/passwd', 'TSVWithNames')",
    "SELECT * FROM system.tables",
    "SELECT 1 INTO OUTFILE '/tmp/eroica-cli-outfile'",
])
def test_sql_on_a_stopped_stack_refuses(tmp_path: Path, make_verdict, sql: str) -> None:
    _stopped_stack(tmp_path, make_verdict)
    res = CliRunner().invoke(cli, ["sql", sql, "--data-dir", str(tmp_path)], env={"EROICA_CLICKHOUSE_URL": ""})
    assert res.exit_code == 2 and "refused" in res.output, res.output
    assert "root:" not in res.output


def test_sql_and_verdicts_through_the_endpoint_with_its_token(tmp_path: Path, make_verdict) -> None:
    chdb_dir = tmp_path / "chdb"
    _stopped_stack(tmp_path, make_verdict)
    sink = VerdictSink(ClickHouseConfig.from_url(f"chdb://{chdb_dir}"))
    token_file = tmp_path / "sink" / TOKEN_FILE
    server = QueryServer(sink, 0, token=ensure_token_file(token_file)).start()
    write_endpoint_file(chdb_dir, server.url, sink.config.target, token_file)
    try:
        env = {"EROICA_CLICKHOUSE_URL": f"chdb://{chdb_dir}"}
        res = CliRunner().invoke(cli, ["sql", "SELECT count() AS n FROM eroica.verdicts FINAL", "--format", "tsv",
                                       "--data-dir", str(tmp_path)], env=env)
        assert res.exit_code == 0 and res.output.splitlines()[-1] == "1", res.output
        res = CliRunner().invoke(cli, ["verdicts", "--format", "json", "--data-dir", str(tmp_path)], env=env)
        assert res.exit_code == 0 and make_verdict().verdict_id in res.output, res.output
        res = CliRunner().invoke(cli, ["sql", "DESCRIBE TABLE file('/etc/passwd', 'TSVWithNames')",
                                       "--data-dir", str(tmp_path)], env=env)
        assert res.exit_code == 2 and "refused" in res.output
        token_file.write_text("not-the-token-" + "x" * 40 + "\n")  # a client without the right token
        res = CliRunner().invoke(cli, ["sql", "SELECT 1", "--data-dir", str(tmp_path)], env=env)
        assert res.exit_code == 1 and "401" in res.output
    finally:
        remove_endpoint_file(chdb_dir)
        server.stop()
        sink.close()
