"""docker-compose.yml cannot run here (no Docker): check that it is consistent instead.

- it parses and has the services the README promises;
- every Eroica service reaches Kafka at the address Kafka advertises, and the
  sink reaches ClickHouse at the server's native port, database and user;
- every ``EROICA_*`` variable it sets is one the code reads (the config
  classes' documented lists, plus the literal names read in the source), and
  each service sets the variables it cannot run without;
- each service runs a registered ``eroica`` command from the Dockerfile's image.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = ("cli", "models", "producers", "streams", "sinks", "stack")
EROICA_SERVICES = ("summariser", "detector", "sink", "simulator")
# What each service cannot do without in a container (the defaults point at 127.0.0.1).
REQUIRED = {
    "summariser": {"EROICA_KAFKA_BOOTSTRAP"},
    "detector": {"EROICA_KAFKA_BOOTSTRAP"},
    "sink": {"EROICA_KAFKA_BOOTSTRAP", "EROICA_CLICKHOUSE_URL"},
    "simulator": {"EROICA_KAFKA_BOOTSTRAP"},
}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _env(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def _documented_vars(files: list[Path] | None = None) -> set[str]:
    """Variables the config classes read, from their own lists and the modules' documented tables.

    Every settings module documents its variables as a table in its docstring
    (one row per variable, the name first on the line); those rows count as
    "read" because the module's ``from_env`` is tested against them.
    """
    from eroica.kafka import config as kafka_config
    from eroica.sinks.clickhouse import config as ch_config
    from eroica.sinks.clickhouse import worker_config

    names = {kafka_config.ENV_PREFIX + s for s in kafka_config._ENV_NAMES.values()}
    names |= set(ch_config.ENV_VARS) | set(worker_config.ENV_VARS)
    for path in files if files is not None else _source_files(*PACKAGE_DIRS):
        doc = ast.get_docstring(ast.parse(path.read_text(), str(path))) or ""
        names |= set(re.findall(r"^(EROICA_[A-Z0-9_]+)\s", doc, re.M))
    return names


def _source_files(*dirs: str) -> list[Path]:
    return [p for d in dirs for p in (ROOT / d).rglob("*.py")
            if not p.name.startswith("test_") and "tests" not in p.parts]


def _read_vars(files: list[Path]) -> set[str]:
    """``EROICA_*`` names the source *reads*: ``x.get("N")``, ``getenv("N")``, ``x["N"]`` (load), ``"N" in x``."""
    names: set[str] = set()

    def literal(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("EROICA_"):
            return node.value
        return None

    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and node.args:
                fn = node.func
                fname = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
                if fname in ("get", "getenv", "pop", "setdefault") and (name := literal(node.args[0])):
                    names.add(name)
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
                if name := literal(node.slice):
                    names.add(name)
            elif isinstance(node, ast.Compare) and any(isinstance(o, ast.In) for o in node.ops):
                if name := literal(node.left):
                    names.add(name)
    return names


def test_services_exist_and_use_the_image(compose: dict) -> None:
    services = compose["services"]
    assert {"kafka", "clickhouse", *EROICA_SERVICES} <= set(services)
    assert (ROOT / "Dockerfile").is_file()
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["eroica"]' in dockerfile
    for name in EROICA_SERVICES:
        svc = services[name]
        assert svc.get("build") == "." and svc.get("image") == "eroica:local", name
        assert "kafka" in svc.get("depends_on", {}), name
    assert "clickhouse" in services["sink"]["depends_on"]


def test_registered_commands(compose: dict) -> None:
    from eroica.cli.main import COMMANDS

    services = compose["services"]
    assert services["sink"]["command"][0] in COMMANDS
    script = services["simulator"]["command"][0]
    for cmd in re.findall(r"eroica (\w+)", script):
        assert cmd in COMMANDS, cmd
    if "worker" not in COMMANDS:
        pytest.skip("`eroica worker` is not registered yet (streams/faust is being written)")
    for name in ("summariser", "detector"):
        assert services[name]["command"] == ["worker", name]


def test_kafka_addresses_are_consistent(compose: dict) -> None:
    services = compose["services"]
    kenv = _env(services["kafka"])
    advertised = dict(item.split("://", 1)[::-1] for item in kenv["KAFKA_ADVERTISED_LISTENERS"].split(","))
    plaintext = next(addr for addr, name in advertised.items() if name == "PLAINTEXT")
    host, port = plaintext.rsplit(":", 1)
    assert host == "kafka"
    listeners = kenv["KAFKA_LISTENERS"].split(",")
    assert f"PLAINTEXT://:{port}" in listeners
    assert kenv["KAFKA_CONTROLLER_QUORUM_VOTERS"].endswith("@kafka:9093") and "CONTROLLER://:9093" in listeners
    for name in EROICA_SERVICES:
        assert _env(services[name])["EROICA_KAFKA_BOOTSTRAP"] == plaintext, name


def test_clickhouse_address_database_and_user(compose: dict) -> None:
    from eroica.sinks.clickhouse import ClickHouseConfig

    services = compose["services"]
    ch_env = _env(services["clickhouse"])
    sink_env = _env(services["sink"])
    config = ClickHouseConfig.from_env(sink_env)
    assert config.backend == "native" and config.host == "clickhouse" and config.port == 9000
    assert config.database == ch_env["CLICKHOUSE_DB"]
    assert config.user == ch_env["CLICKHOUSE_USER"] and config.password == ch_env["CLICKHOUSE_PASSWORD"]
    assert urlsplit(sink_env["EROICA_CLICKHOUSE_URL"]).port == 9000
    assert any(str(p).endswith(":9000:9000") for p in services["clickhouse"]["ports"])
    # the sink's health check asks the port its endpoint listens on
    port = sink_env["EROICA_SINK_HTTP_PORT"]
    assert f"127.0.0.1:{port}/health" in " ".join(services["sink"]["healthcheck"]["test"])


def test_every_variable_set_is_read_and_required_ones_are_set(compose: dict) -> None:
    known = _documented_vars() | _read_vars(_source_files(*PACKAGE_DIRS))
    services = compose["services"]
    for name in ("sink", "simulator"):
        env = _env(services[name])
        unknown = {k for k in env if k.startswith("EROICA_")} - known
        assert not unknown, f"{name} sets variables no code reads: {sorted(unknown)}"
        assert REQUIRED[name] <= set(env), f"{name} lacks {sorted(REQUIRED[name] - set(env))}"


def test_worker_variables_are_read_by_the_workers(compose: dict) -> None:
    """The stream workers' variables must be read by the workers' own code (streams/faust, cli/worker_cmd.py)."""
    worker_files = _source_files("streams/faust")
    if (ROOT / "cli" / "worker_cmd.py").is_file():
        worker_files.append(ROOT / "cli" / "worker_cmd.py")
    if all(p.name == "__init__.py" for p in worker_files):
        pytest.skip("the faust workers (streams/faust, cli/worker_cmd.py) are not written yet")
    known = _documented_vars(worker_files) | _read_vars(worker_files + _source_files("producers"))
    services = compose["services"]
    for name in ("summariser", "detector"):
        env = _env(services[name])
        unknown = {k for k in env if k.startswith("EROICA_")} - known
        assert not unknown, f"{name} sets variables the workers do not read: {sorted(unknown)}"
        assert REQUIRED[name] <= set(env)


def test_the_scanner_finds_reads_and_ignores_writes(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text('import os\nos.environ.get("EROICA_A")\nenv["EROICA_B"]\nenv["EROICA_C"] = 1\n'
                   'os.getenv("EROICA_D", "x")\nif "EROICA_E" in os.environ: pass\nenv.update({"EROICA_F": 1})\n')
    assert _read_vars([src]) == {"EROICA_A", "EROICA_B", "EROICA_D", "EROICA_E"}


def test_documented_lists_match_the_docstrings() -> None:
    """The ENV_VARS lists are what the modules' tables document (so neither drifts)."""
    from eroica.sinks.clickhouse import config as ch_config
    from eroica.sinks.clickhouse import worker_config

    for module in (ch_config, worker_config):
        documented = set(re.findall(r"^(EROICA_[A-Z0-9_]+)\s", module.__doc__ or "", re.M))
        assert documented == set(module.ENV_VARS), module.__name__


# --- Grafana: the dashboards' data source reaches the compose ClickHouse ---------------------------

GRAFANA = ROOT / "deploy" / "grafana"


def _mounts(service: dict) -> dict[str, Path]:
    """container path -> host path of the service's bind mounts (relative to the compose file)."""
    out = {}
    for item in service.get("volumes", []):
        parts = str(item).split(":")
        if parts[0].startswith("."):
            out[parts[1]] = (ROOT / parts[0]).resolve()
    return out


def test_grafana_service_provisions_the_dashboards(compose: dict) -> None:
    g = compose["services"]["grafana"]
    assert str(g["image"]).startswith("grafana/grafana:")
    assert "clickhouse" in g["depends_on"]
    assert "grafana-clickhouse-datasource" in _env(g)["GF_INSTALL_PLUGINS"]
    assert any(str(p).endswith(":3000") for p in g["ports"])
    mounts = _mounts(g)
    assert mounts["/etc/grafana/provisioning"] == (GRAFANA / "provisioning").resolve()
    providers = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "eroica.yaml").read_text())["providers"]
    dash_path = providers[0]["options"]["path"]
    assert mounts[dash_path] == (GRAFANA / "dashboards").resolve()
    home = _env(g)["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(dash_path + "/") and (GRAFANA / "dashboards" / Path(home).name).is_file()


def test_grafana_datasource_matches_the_clickhouse_service(compose: dict) -> None:
    ch_env = _env(compose["services"]["clickhouse"])
    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "clickhouse.yaml").read_text())["datasources"]
    assert len(ds) == 1
    source = ds[0]
    j = source["jsonData"]
    assert source["type"] == "grafana-clickhouse-datasource"
    assert (j["host"], j["protocol"]) == ("clickhouse", "native") and "clickhouse" in compose["services"]
    assert j["port"] == 9000 and any(str(p).endswith(":9000:9000") for p in compose["services"]["clickhouse"]["ports"])
    assert j["username"] == ch_env["CLICKHOUSE_USER"] and source["secureJsonData"]["password"] == ch_env["CLICKHOUSE_PASSWORD"]
    assert j["defaultDatabase"] == ch_env["CLICKHOUSE_DB"]
    # every panel and variable of every dashboard uses this data source
    import json

    for path in sorted((GRAFANA / "dashboards").glob("*.json")):
        dash = json.loads(path.read_text())
        queried = [p for p in dash["panels"] if p.get("targets")]
        assert queried, path.name
        for p in queried:
            assert p["datasource"]["uid"] == source["uid"], (path.name, p["title"])
            assert all(t["datasource"]["uid"] == source["uid"] for t in p["targets"]), (path.name, p["title"])
        for var in dash["templating"]["list"]:
            if var["type"] == "query":
                assert var["datasource"]["uid"] == source["uid"], (path.name, var["name"])
