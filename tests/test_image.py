"""The image, built and run for real: Debian's podman, on a base made from Debian's packages.

Docker Hub cannot be reached here, so the base is ``deploy/base-image.sh``'s stand-in
for ``python:3.11-slim`` (Debian bookworm's Python 3.11), built once and kept; the
tidal image is built from the Dockerfile in every session. Containers get explicit
rlimits (runc fails to set them otherwise here), and health is run with ``podman
healthcheck run`` (there is no systemd to run its timer).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidal.client import Client, Signal, Unauthorized, Unavailable

from .conftest import tmpfs
from .test_deploy import ROOT, free_port, need

BASE = "localhost/tidal-python:3.11"
TOKEN = "a-token-of-16-chars"
LIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
#: the first run makes the base (about a minute, debootstrap) and builds both images
pytestmark = pytest.mark.timeout(600)


@functools.cache
def runtime() -> str:
    """The OCI runtime that starts containers on this host, found once: crun (podman's
    default) cannot where cgroups are v1 or hybrid, runc can (``deploy/oci-runtime.sh``)."""
    need("podman", "apt-get install podman (make test installs it as root)")
    done = subprocess.run(
        ["bash", str(ROOT / "deploy" / "oci-runtime.sh")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.fail(done.stderr.strip())
    return done.stdout.strip()


def podman(
    *args: str, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    exe = need("podman", "apt-get install podman (make test installs it as root)")
    done = subprocess.run(
        [exe, "--runtime", runtime(), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {done.stderr.strip()}")
    return done


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    """The tidal image, built from this tree's Dockerfile on the local base."""
    need("debootstrap", "apt-get install debootstrap (make test installs it as root)")
    if podman("image", "exists", BASE, check=False).returncode != 0:
        done = subprocess.run(
            ["bash", str(ROOT / "deploy" / "base-image.sh"), BASE],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    tag = f"localhost/tidal-test:{uuid.uuid4().hex[:8]}"
    began = time.monotonic()
    podman(
        "build", "--network", "host", "--pull=never", "--format", "docker",
        "--build-arg", f"PYTHON_IMAGE={BASE}", "-t", tag, str(ROOT), timeout=600,
    )  # fmt: skip
    print(f"built {tag} in {time.monotonic() - began:.1f}s")
    yield tag
    podman("rmi", "-f", tag, check=False)


class Container:
    """One ``podman run -d``; removed, with its volume, by the test's end."""

    def __init__(self, image: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        env_args = [a for k, v in (env or {}).items() for a in ("-e", f"{k}={v}")]
        self.id = podman(
            "run", "-d", *LIMITS, "-p", f"127.0.0.1:{self.port}:7411", *env_args, *args, image,
        ).stdout.strip()  # fmt: skip

    def state(self) -> dict[str, object]:
        data = json.loads(podman("inspect", self.id).stdout)[0]["State"]
        return dict(data)

    async def ready(self) -> None:
        """Listening: the health check passes (as an orchestrator would see it)."""
        for _ in range(300):
            if podman("healthcheck", "run", self.id, check=False).returncode == 0:
                return
            if not self.state()["Running"]:
                break
            await asyncio.sleep(0.1)  # a container's boot, polled as its engine does
        raise AssertionError("never healthy: " + podman("logs", self.id, check=False).stderr)

    async def connect(self, token: str | None = TOKEN) -> Client:
        return await Client.connect("127.0.0.1", self.port, timeout=10, token=token)

    def stop(self) -> int:
        podman("stop", "-t", "30", self.id, timeout=60)
        code = self.state()["ExitCode"]
        assert isinstance(code, int)
        return code

    def remove(self) -> None:
        podman("rm", "-f", "-v", self.id, check=False)  # and its anonymous /data volume


@pytest.fixture
def volume() -> Iterator[str]:
    name = f"tidal-test-{uuid.uuid4().hex[:8]}"
    podman("volume", "create", name)
    yield name
    podman("volume", "rm", "-f", name, check=False)


async def test_the_image_serves_with_a_token_and_keeps_a_leave_across_containers(
    image: str, volume: str
) -> None:
    first = Container(image, "-v", f"{volume}:/data", env={"TIDAL_TOKEN": TOKEN})
    try:
        await first.ready()
        with pytest.raises(Unauthorized):
            async with await first.connect(token="not-the-token-00") as c:
                await c.ping()
        async with await first.connect() as c:
            acks = [await c.signal(u, "song", "view", communities=["c"]) for u in range(20)]
            await c.leave(7)
        assert first.stop() == 0  # SIGTERM: a clean shutdown
    finally:
        first.remove()
    second = Container(image, "-v", f"{volume}:/data", env={"TIDAL_TOKEN": TOKEN})
    try:
        await second.ready()
        async with await second.connect() as c:
            assert (await c.stats())["compiled"] is True  # the image's hot path is mypyc's
            assert (await c.status(7)).status == "left"
            assert (await c.counts("song")).ledger["view"].count == len(acks)
            assert (await c.signal(7, "song", "view")).seq == acks[-1].seq + 1
    finally:
        second.remove()


def test_the_image_runs_compiled_and_its_runtime_has_no_compiler(image: str) -> None:
    """The build stage compiles the hot modules (TIDAL_COMPILE=required fails it if it
    cannot); the runtime stage gets the wheel and stays without a compiler."""
    done = podman("run", "--rm", *LIMITS, image, "--version", timeout=60)
    assert done.stdout.strip().endswith("(compiled)"), done.stdout
    probe = "import shutil, sys; sys.exit(shutil.which('gcc') is not None)"
    done = podman(
        "run", "--rm", *LIMITS, "--entrypoint", "python", image, "-c", probe,
        check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, "the runtime stage has a C compiler"


def test_the_image_refuses_to_listen_beyond_loopback_without_a_token(image: str) -> None:
    done = podman("run", "--rm", *LIMITS, image, check=False, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "without a token" in done.stderr + done.stdout


async def test_the_container_runs_as_10001_and_writes_only_data(image: str) -> None:
    box = Container(image, env={"TIDAL_TOKEN": TOKEN})
    try:
        await box.ready()
        assert podman("exec", box.id, "id", "-u").stdout.strip() == "10001"
        for path in ("/etc/tidal-was-here", "/usr/local/tidal-was-here", "/tidal-was-here"):
            assert podman("exec", box.id, "touch", path, check=False).returncode != 0, path
        podman("exec", box.id, "touch", "/data/tidal-was-here")
    finally:
        box.remove()


async def test_health_fails_once_storage_has_failed(image: str, tmp_path: Path) -> None:
    """/data on a small file system of the host's, filled up: the next commit fails, and so
    does the image's health check."""
    with tmpfs(tmp_path / "small", "4m") as small:
        os.chown(small, 10001, 0)
        box = Container(image, "-v", f"{small}:/data", env={"TIDAL_TOKEN": TOKEN})
        try:
            await box.ready()
            podman("exec", box.id, "sh", "-c", "cat /dev/zero > /data/filler", check=False)
            async with await box.connect() as c:
                with pytest.raises(Unavailable):
                    for i in range(2000):
                        await c.signal_batch([Signal(i, "e" * 200, "view")] * 100)
                health = await c.health()
            assert health["status"] == "failing", health
            assert podman("healthcheck", "run", box.id, check=False).returncode != 0
        finally:
            box.remove()


def deploy_image(name: str) -> Iterator[str]:
    """An image of ``deploy/NAME``, on the same base as tidal's; removed afterwards."""
    tag = f"localhost/tidal-{name}-test:{uuid.uuid4().hex[:8]}"
    podman(
        "build", "--network", "host", "--pull=never", "--format", "docker",
        "--build-arg", f"BASE={BASE}", "-t", tag, str(ROOT / "deploy" / name),
        timeout=600,
    )  # fmt: skip
    yield tag
    podman("rmi", "-f", tag, check=False)


@pytest.fixture(scope="module")
def postgres_image(image: str) -> Iterator[str]:
    """deploy/postgres: a stand-in for the official postgres:15 image."""
    yield from deploy_image("postgres")


class Compose:
    """``podman-compose`` on the project's docker-compose.yml, with an override for what
    this machine needs (rlimits) and the images built here."""

    def __init__(self, tmp_path: Path, images: dict[str, str], *profiles: str, **env: str) -> None:
        self.exe = need("podman-compose", "pip install podman-compose (in the dev extras)")
        limits = "{nofile: {soft: 1024, hard: 1024}, nproc: {soft: 1024, hard: 1024}}"
        override = tmp_path / "override.yml"
        override.write_text(
            "services:\n"
            + "".join(
                f"  {service}:\n    image: {tag}\n    ulimits: {limits}\n"
                for service, tag in images.items()
            )
        )
        self.project = f"tidaltest{uuid.uuid4().hex[:6]}"
        self.files = ["-f", str(ROOT / "docker-compose.yml"), "-f", str(override)]
        self.files += [arg for profile in profiles for arg in ("--profile", profile)]
        self.env = dict(os.environ, TIDAL_TOKEN=TOKEN, TIDAL_PYTHON_IMAGE=BASE, **env)

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.exe, "--podman-args", f"--runtime {runtime()}", *self.files,
             "-p", self.project, *args], cwd=ROOT, env=self.env,
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip

    def healthy(self, service: str, timeout: float = 30) -> str:
        container = self.container(service)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if podman("healthcheck", "run", container, check=False).returncode == 0:
                return container
            time.sleep(0.1)  # a container's boot, polled as its engine does
        logs = podman("logs", container, check=False)
        raise AssertionError(f"{service} never became healthy:\n{logs.stdout}{logs.stderr}")

    def container(self, service: str) -> str:
        return f"{self.project}_{service}_1"

    def down(self) -> None:
        done = self("down", "-v")
        assert done.returncode == 0, done.stderr
        volumes = podman("volume", "ls", "--format", "{{.Name}}").stdout.split()
        assert not [v for v in volumes if v.startswith(self.project)], volumes


def test_podman_compose_brings_the_tidal_service_up_and_down(image: str, tmp_path: Path) -> None:
    """On a free port of its own: ``make test`` passes while ``make run`` serves on 7411."""
    port = free_port()
    compose = Compose(tmp_path, {"tidal": image}, TIDAL_BIND=f"127.0.0.1:{port}")
    try:
        done = compose("up", "-d", "--no-build", "tidal")
        assert done.returncode == 0, done.stderr
        container = compose.healthy("tidal")
        stats = podman("exec", container, "tidal", "stats", "--host", "127.0.0.1")
        assert "signals" in stats.stdout, stats.stdout  # TIDAL_TOKEN, from the compose file
        scrape = (
            "import urllib.request as u; print(u.urlopen('http://127.0.0.1:7412/metrics').read())"
        )
        metrics = podman("exec", container, "python", "-c", scrape).stdout
        assert "tidal_connections" in metrics  # where Prometheus scrapes it
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            pass  # published where it was told
    finally:
        compose.down()


async def test_podman_compose_runs_tidal_on_postgresql(
    image: str, postgres_image: str, tmp_path: Path
) -> None:
    """The postgres profile: PostgreSQL (the stand-in) with its volume, tidal pointed at it,
    the password from the environment only."""
    port = free_port()
    compose = Compose(
        tmp_path,
        {"postgres": postgres_image, "tidal-pg": image},
        "postgres",
        TIDAL_PG_PASSWORD="a-pg-password",
        TIDAL_PG_BIND=f"127.0.0.1:{port}",
    )
    try:
        done = compose("up", "-d", "--no-build", "tidal-pg")
        assert done.returncode == 0, done.stderr
        container = compose.healthy("tidal-pg")
        async with await Client.connect("127.0.0.1", port, timeout=10, token=TOKEN) as c:
            await c.leave(42)
            assert (await c.stats())["backend"] == "postgresql"
        logs = podman("logs", container).stdout + podman("logs", container).stderr
        assert "a-pg-password" not in logs
    finally:
        compose.down()


@pytest.fixture(scope="module")
def patroni_image(image: str) -> Iterator[str]:
    """deploy/patroni: PostgreSQL 15 under Patroni, and etcd, from Debian's packages."""
    yield from deploy_image("patroni")


async def test_podman_compose_runs_the_ha_profile_and_a_standby_takes_over(
    image: str, patroni_image: str, tmp_path: Path
) -> None:
    """The ha profile: etcd, two Patroni nodes, two tidals; one serves, the other waits.
    The serving one's container is killed: the other takes over, with what was acknowledged."""
    ports = {"tidal-ha": free_port(), "tidal-ha-b": free_port()}
    compose = Compose(
        tmp_path,
        {"etcd": patroni_image, "pg1": patroni_image, "pg2": patroni_image}
        | dict.fromkeys(ports, image),
        "ha",
        TIDAL_PG_PASSWORD="a-pg-password",
        TIDAL_PG_SUPERUSER_PASSWORD="a-superuser-password",
        TIDAL_PG_REPLICATION_PASSWORD="a-replication-password",
        TIDAL_HA_BIND=f"127.0.0.1:{ports['tidal-ha']}",
        TIDAL_HA_B_BIND=f"127.0.0.1:{ports['tidal-ha-b']}",
    )
    hosts = [("127.0.0.1", port) for port in ports.values()]
    try:
        done = compose("up", "-d", "--no-build", *ports)
        assert done.returncode == 0, done.stderr
        serving = await asyncio.to_thread(one_serving, compose, list(ports))
        async with await Client.connect(hosts, timeout=30, token=TOKEN, auto_keys=True) as c:
            acks = [await c.signal(i, "e", "view", communities=["c"]) for i in range(50)]
            await c.leave(7)
            podman("kill", "--signal", "KILL", compose.container(serving))
            acks += [await c.signal(i, "e", "view", communities=["c"]) for i in range(50, 60)]
            assert (await c.status(7)).left
            assert (await c.counts("e")).ledger["view"].count == 60
            assert len({a.seq for a in acks}) == 60
            assert (await c.stats())["backend"] == "postgresql"
    finally:
        compose.down()


def one_serving(compose: Compose, services: list[str]) -> str:
    """The service whose tidal serves (health ok), once the other waits as a standby."""
    deadline = time.monotonic() + 240  # Patroni's bootstrap, a base backup, then tidal's
    while time.monotonic() < deadline:
        healthy = [
            name
            for name in services
            if podman("healthcheck", "run", compose.container(name), check=False).returncode == 0
        ]
        if len(healthy) == 1:
            return healthy[0]
        time.sleep(0.5)  # containers' boots, polled as their engine does
    logs = [podman("logs", compose.container(name), check=False) for name in services]
    raise AssertionError("no tidal served:\n" + "".join(p.stdout + p.stderr for p in logs))
