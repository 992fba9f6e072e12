"""The monitoring mixin (``deploy/monitoring``): alerts tested firing and not by promtool,
and Debian's real Prometheus scraping a real tidal under load, its recording rules and
alerts loaded: every dashboard panel's expression returns data, every alert's expression
evaluates, and no file names a metric tidal does not export."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tidal.client import Client, InvalidParams

from .conftest import ServerProcess
from .test_deploy import ROOT, compose_config, free_port, need

MONITORING = ROOT / "deploy" / "monitoring"
RULE_FILES = (MONITORING / "rules.yml", MONITORING / "alerts.yml")
DASHBOARD = MONITORING / "grafana" / "tidal.json"
#: a name tidal exports, as the files write it: not one a recording rule made (``a:tidal_b:c``)
NAMED = re.compile(r"(?<![:\w])tidal_[a-z_]+")
SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_info", "_created")


def promtool() -> str:
    return need("promtool", "Debian's prometheus package has it (make test installs it)")


def test_each_alert_fires_when_it_should_and_not_otherwise() -> None:
    tool = promtool()
    checked = subprocess.run([tool, "check", "rules", *map(str, RULE_FILES)],
                             capture_output=True, text=True, check=False)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run([tool, "test", "rules", "tests.yml"], cwd=MONITORING,
                            capture_output=True, text=True, check=False)  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # every alert is tested, and follows the conventions: Tidal..., severity, summary,
    # description, and a runbook section of its own
    tests = yaml.safe_load((MONITORING / "tests.yml").read_text())["tests"]
    named = {t["alertname"] for case in tests for t in case["alert_rule_test"]}
    runbook = (ROOT / "docs" / "RUNBOOK.md").read_text()
    for rule in alerts():
        name = rule["alert"]
        assert re.fullmatch(r"Tidal[A-Z][A-Za-z]+", name), name
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"]), name
        assert f"\n## {name}\n" in runbook, f"docs/RUNBOOK.md has no section for {name}"
        assert rule["annotations"]["runbook_url"].endswith(f"#{name.lower()}"), name
        assert name in named, f"tests.yml does not test {name}"


def alerts() -> Iterator[dict[str, Any]]:
    for group in yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"]:
        yield from group["rules"]


def panel_exprs() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p["targets"]]


def test_the_monitoring_profile_provisions_the_rules_and_the_dashboard() -> None:
    env = dict(os.environ, TIDAL_TOKEN="t")
    env.pop("GRAFANA_BIND", None)
    done = compose_config(env, "--profile", "monitoring")
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    mounted = mounts(services["prometheus"])
    prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    for path in prometheus["rule_files"]:
        assert mounted[path].resolve() in {f.resolve() for f in RULE_FILES}, path
    grafana = mounts(services["grafana"])
    assert grafana["/var/lib/grafana/dashboards/tidal.json"].resolve() == DASHBOARD.resolve()
    provisioning = grafana["/etc/grafana/provisioning"]
    assert (provisioning / "dashboards" / "tidal.yml").is_file()
    source = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    assert source["datasources"][0]["url"] == "http://prometheus:9090"
    [port] = services["grafana"]["ports"]
    published = port if isinstance(port, str) else port.get("host_ip", "0.0.0.0")
    assert published.startswith("127.0.0.1"), port  # loopback unless GRAFANA_BIND says


def mounts(service: dict[str, Any]) -> dict[str, Path]:
    """A service's volumes, target -> source, in either form docker-compose prints."""
    out = {}
    for volume in service["volumes"]:
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        else:
            source, target = volume["source"], volume["target"]
        out[target] = (ROOT / source).resolve()
    return out


class Prometheus:
    """Debian's prometheus on loopback, scraping ``target`` every second, with tidal's
    rules and alerts evaluated every second."""

    def __init__(self, tmp: Path, target: int) -> None:
        binary = need("prometheus", "Debian's prometheus package (make test installs it)")
        self.port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(f) for f in RULE_FILES],
            "scrape_configs": [
                {"job_name": "tidal", "static_configs": [{"targets": [f"127.0.0.1:{target}"]}]}
            ],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = (tmp / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def get(self, path: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}"
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())

    def query(self, expr: str) -> list[Any]:
        answer = self.get("/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert answer["status"] == "success", (expr, answer)
        result: list[Any] = answer["data"]["result"]
        return result

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


async def until(check: Any, what: str, within: float = 60.0) -> None:
    began = time.monotonic()
    while not await asyncio.to_thread(check):
        if time.monotonic() - began > within:
            raise AssertionError(f"not within {within:.0f}s: {what}")
        await asyncio.sleep(0.2)  # another process's state, polled: a pace


async def load(c: Client) -> None:
    """A little of everything the panels show: signals, leaves, a purge and an erasure,
    a refused request, and a consumer group whose consumer acknowledges."""
    await c.group_create("index")
    for user in range(1, 41):
        await c.signal(user, "song", "play", communities=["jazz"])
    for user in range(1, 6):
        await c.leave(user)
    await c.purge(6)
    await c.erase(7)
    with pytest.raises(InvalidParams):
        await c.call("signal", -1, "e", "view")
    consumer = c.consume("index")
    got = 0
    async for d in consumer:
        await d.ack()
        got += 1
        if got == 7:  # 5 leaves, a purge, an erasure
            break
    await consumer.close()


async def test_prometheus_scrapes_a_loaded_tidal_and_every_panel_and_alert_reads_data(
    process: ServerProcess, tmp_path: Path
) -> None:
    metrics_port = free_port()
    process.extra = (*process.extra, "--metrics-port", str(metrics_port))
    await process.start()
    prometheus = Prometheus(tmp_path, metrics_port)
    try:
        await until(lambda: _ready(prometheus), "Prometheus ready")
        async with await process.connect() as c:
            await load(c)
            for user in range(41, 81):  # rates over two scrapes at least, after the load
                await c.signal(user, "song", "play", communities=["jazz"])
                await asyncio.sleep(0.05)  # spread over scrapes: a pace, not a wait for a state
        empty, deadline = panel_exprs(), time.monotonic() + 60
        while empty := [
            (t, e) for t, e in empty if not await asyncio.to_thread(prometheus.query, e)
        ]:
            assert time.monotonic() < deadline, f"no data in 60 s for these panels: {empty}"
            await asyncio.sleep(0.2)  # Prometheus's next scrape and rule evaluation: polled
        for rule in alerts():  # each evaluates; those the load trips are named
            prometheus.query(rule["expr"])
        rules = prometheus.get("/api/v1/rules")["data"]["groups"]
        health = [(r["name"], r["health"]) for g in rules for r in g["rules"]]
        assert all(h == "ok" for _, h in health), health
        exported = exported_names(prometheus.query('{job="tidal"}'))
    finally:
        prometheus.close()
    named = set()
    for path in (*RULE_FILES, DASHBOARD, MONITORING / "tests.yml"):
        named |= set(NAMED.findall(path.read_text()))
    unknown = {n for n in named if n not in exported}
    assert not unknown, f"files name metrics tidal does not export: {sorted(unknown)}"


def _ready(prometheus: Prometheus) -> bool:
    try:
        return bool(prometheus.query('up{job="tidal"} == 1'))
    except OSError:
        return False


def exported_names(series: list[Any]) -> set[str]:
    """Every name tidal's scrape had, and each without its histogram or counter suffix."""
    names = {s["metric"]["__name__"] for s in series}
    return names | {n[: -len(sfx)] for n in names for sfx in SUFFIXES if n.endswith(sfx)}
