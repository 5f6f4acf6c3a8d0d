"""Cost columns, the job_windows view and ``eroica fleet`` on both backends (chdb; server 18.16 where installed)."""

from __future__ import annotations

import json
import math

from click.testing import CliRunner

from eroica.sinks.clickhouse.fleet import drain_list, fleet_rows, fleet_sql, job_ends_sql
from eroica.sinks.clickhouse.schema import ddl_statements, view_statements

T0 = 1_700_000_000_000_000_000
W = 30_000_000_000  # 30 s windows


def _store(verdict_sink, make_verdict):
    verdict_sink.ensure_schema()
    for stmt in view_statements(verdict_sink.config):   # what ensure_schema is to run after its column check
        verdict_sink.client.execute(stmt)
    vs = []
    # job A: node-3's GPU 1 (rank 25) throttled in 3 windows; job B: the same GPU, 2 windows
    for job, n in (("job-a", 3), ("job-b", 2)):
        for k in range(n):
            vs.append(make_verdict(job=job, rank=25, node="node-3", gpu=1, window_start_ns=T0 + k * W,
                                   window_ns=W, job_slowdown=1.25, cost=1.25, gpu_hours_lost_per_hour=12.8))
    # job B, another node's NIC (node scope), once, in its first window
    # (the port blamed is in its evidence, as the detector writes it: no column of the table holds it)
    vs.append(make_verdict(job="job-b", rank=-1, node="node-7", gpu=-1, scope="node", component="nic",
                           window_start_ns=T0, window_ns=W, job_slowdown=1.25, cost=1.05,
                           gpu_hours_lost_per_hour=3.0476,
                           evidence={"nic": {"culprit": "mlx5_0", "class": "rail"}, "link_gbps": {"culprit": 100.0}}))
    # a job-wide finding without a cost: not hardware, and its cost stays NaN (null)
    vs.append(make_verdict(job="job-b", rank=-1, node="", gpu=-1, scope="job", component="config",
                           window_start_ns=T0 + W, window_ns=W, job_slowdown=1.25))
    verdict_sink.write_verdicts(vs)
    return vs


def test_cost_columns_round_trip(verdict_sink, make_verdict):
    vs = _store(verdict_sink, make_verdict)
    got = {v.verdict_id: v for v in verdict_sink.query_verdicts(limit=100)}
    assert got[vs[0].verdict_id].cost == 1.25 and got[vs[0].verdict_id].gpu_hours_lost_per_hour == 12.8
    assert got[vs[-1].verdict_id].cost is None and got[vs[-1].verdict_id].job_slowdown == 1.25


def test_job_windows_view(verdict_sink, make_verdict):
    _store(verdict_sink, make_verdict)
    db = verdict_sink.config.database
    res = verdict_sink.run_readonly_sql(
        f"SELECT job, window_start_ns, window_slowdown, top_cost, top_component, top_node, top_rank, world_size, "
        f"culprit_gpu_hours_lost_per_hour, job_gpu_hours_lost_per_hour "
        f"FROM `{db}`.`job_windows` ORDER BY job, window_start_ns")
    rows = res.dicts()
    assert [(r["job"], r["window_start_ns"]) for r in rows] == [
        ("job-a", T0), ("job-a", T0 + W), ("job-a", T0 + 2 * W), ("job-b", T0), ("job-b", T0 + W)]
    first_b = rows[3]
    assert first_b["top_node"] == "node-3" and first_b["top_component"] == "gpu" and first_b["top_rank"] == 25
    assert first_b["world_size"] == 64   # 12.8 / (1 - 1/1.25)
    assert math.isclose(first_b["job_gpu_hours_lost_per_hour"], 64 * (1 - 1 / 1.25), rel_tol=1e-9)


def test_fleet_lists_the_node_two_jobs_blamed(verdict_sink, make_verdict):
    _store(verdict_sink, make_verdict)
    cfg = verdict_sink.config
    vt, st = f"`{cfg.database}`.`{cfg.verdicts_table}`", f"`{cfg.database}`.`{cfg.summaries_table}`"
    per_job = verdict_sink.run_readonly_sql(fleet_sql(vt, None)).dicts()
    ends = verdict_sink.run_readonly_sql(job_ends_sql(vt, st, None)).dicts()
    rows = fleet_rows(per_job, ends)
    top = rows[0]
    assert (top.node, top.component, top.gpu) == ("node-3", "gpu", 1)
    assert top.jobs == 2 and top.times_blamed == 5 and top.job_list == ["job-a", "job-b"]
    assert math.isclose(top.gpu_hours_lost, 5 * 12.8 * W / 3.6e12, abs_tol=1e-4)  # rounded to 4 decimals
    assert top.first_seen_ns == T0 and top.last_seen_ns == T0 + 3 * W and top.open
    nic = rows[1]
    assert (nic.node, nic.component, nic.gpu, nic.jobs) == ("node-7", "nic", -1, 1)
    assert [r.component for r in rows] == ["gpu", "nic"]   # the config finding is no hardware
    assert drain_list(rows) == ["node-3"]
    assert drain_list(rows, min_jobs=1) == ["node-3", "node-7"]
    # since: only the last window of job-a remains
    late = fleet_rows(verdict_sink.run_readonly_sql(fleet_sql(vt, T0 + 3 * W)).dicts(), ends)
    assert [(r.node, r.jobs, r.times_blamed) for r in late] == [("node-3", 1, 1)]


def test_fleet_command(verdict_sink, make_verdict, monkeypatch, tmp_path):
    _store(verdict_sink, make_verdict)
    cfg = verdict_sink.config
    verdict_sink.close()   # chdb serves a directory to one process object at a time
    from eroica.cli.main import cli

    url = (f"chdb://{cfg.chdb_path}?database={cfg.database}" if cfg.backend == "chdb"
           else f"clickhouse://{cfg.user}@{cfg.host}:{cfg.port}/{cfg.database}")
    runner = CliRunner()
    res = runner.invoke(cli, ["fleet", "--since", "all", "--format", "json", "--clickhouse", url,
                              "--data-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["culprits"][0]["node"] == "node-3" and data["culprits"][0]["jobs"] == 2
    assert [c["nic_ports"] for c in data["culprits"]] == [[], ["mlx5_0"]]
    # the table names what was blamed: the GPU's index for a GPU, the port for a NIC
    res = runner.invoke(cli, ["fleet", "--since", "all", "--clickhouse", url, "--data-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    head, gpu, nic = res.output.splitlines()
    assert head.split()[:3] == ["node", "component", "hardware"]
    assert gpu.split()[:4] == ["node-3", "gpu", "GPU", "1"] and nic.split()[:3] == ["node-7", "nic", "mlx5_0"]
    res = runner.invoke(cli, ["fleet", "--since", "all", "--drain-list", "--clickhouse", url,
                              "--data-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == ["node-3"]


def test_verdicts_command_names_each_rows_job(verdict_sink, make_verdict, tmp_path):
    """``eroica verdicts`` over several jobs: every row says its job, as a table and as blocks at 80 columns."""
    _store(verdict_sink, make_verdict)
    cfg = verdict_sink.config
    verdict_sink.close()
    from eroica.cli.main import cli

    url = (f"chdb://{cfg.chdb_path}?database={cfg.database}" if cfg.backend == "chdb"
           else f"clickhouse://{cfg.user}@{cfg.host}:{cfg.port}/{cfg.database}")
    runner = CliRunner()
    wide = runner.invoke(cli, ["verdicts", "--clickhouse", url, "--data-dir", str(tmp_path)], env={"COLUMNS": "200"})
    assert wide.exit_code == 0, wide.output
    assert " job " in wide.output.splitlines()[1].replace("┃", " ")   # the header has a job column
    lines = [line for line in wide.output.splitlines() if "node-" in line or "config" in line]
    assert sum("job-a" in line for line in lines) == 3 and sum("job-b" in line for line in lines) == 4
    narrow = runner.invoke(cli, ["verdicts", "--clickhouse", url, "--data-dir", str(tmp_path)], env={"COLUMNS": "80"})
    assert narrow.exit_code == 0, narrow.output
    heads = [line for line in narrow.output.splitlines() if not line.startswith(" ")]
    assert len(heads) == 7 and all(line.split()[1] in ("job-a", "job-b") for line in heads)
    assert [line.split()[1] for line in heads].count("job-a") == 3
    # JSON is the contract's verdicts, which always carried the job
    js = runner.invoke(cli, ["verdicts", "--format", "json", "--clickhouse", url, "--data-dir", str(tmp_path)])
    assert sorted({v["job"] for v in json.loads(js.output)}) == ["job-a", "job-b"]


def test_view_ddl_is_in_the_shared_subset_and_apart():
    from eroica.sinks.clickhouse import ClickHouseConfig

    cfg = ClickHouseConfig(database="ev")
    views = "\n".join(view_statements(cfg))
    assert "job_windows" in views and "job_windows" not in "\n".join(ddl_statements(cfg))
    for word in ("Nullable", "Map(", "DateTime64", "TTL", "LowCardinality", "JSON", "%(", "{"):
        assert word not in views
