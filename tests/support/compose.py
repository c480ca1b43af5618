"""Compose files for tests: as ``docker-compose config`` resolves them (Debian's
docker-compose), and compose projects run for real on a Docker engine."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from cli.supervisor import NotReady
from llmq.embedded import free_port
from tests.support.processes import alive, wait_for

ROOT = Path(__file__).resolve().parent.parent.parent
#: Test projects are named by this and the test process's pid (and a suffix).
PROJECT_PREFIX = "llmqtest"

#: Tests that need the ``docker-compose`` command; .ci/run installs it.
needs_docker_compose = pytest.mark.skipif(
    shutil.which("docker-compose") is None,
    reason="docker-compose is not installed (Debian package docker-compose; .ci/run installs it)",
)


def resolved(compose: Path) -> dict[str, Any]:
    """The file after ``docker-compose config`` validated and resolved it."""
    result = subprocess.run(
        ["docker-compose", "-f", str(compose), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=compose.parent,
    )
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = yaml.safe_load(result.stdout)
    return config


class Compose:
    """One compose project (of docker-compose.yml unless ``file`` says), run by
    ``docker compose`` or Debian's ``docker-compose`` (v1), whichever is here; both
    name containers differently, so containers are found by service (``ps -q SERVICE``)."""

    def __init__(
        self, command: list[str], project: str, port: int, file: Path = ROOT / "docker-compose.yml"
    ) -> None:
        self.command = command
        self.file = file
        self.project = project
        self.url = f"http://127.0.0.1:{port}"
        self.env = {**os.environ, "API_PORT": str(port)}

    def __call__(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        argv = [*self.command, "-f", str(self.file), "-p", self.project, *args]
        done = subprocess.run(
            argv, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout[-3000:]}\n"
                f"{done.stderr[-3000:]}"
            )
        return done.stdout

    def ids(self, service: str = "") -> list[str]:
        """The service's containers (all services' without one), stopped ones too."""
        return self("ps", "-a", "-q", *([service] if service else [])).split()

    def workers(self, n: int) -> None:
        """Exactly ``n`` worker containers, running and registered with the API."""
        self("up", "-d", "--no-build", "--no-recreate", "--scale", f"worker={n}")
        hosts = {inspect(c)["Config"]["Hostname"] for c in self.ids("worker")}
        assert len(hosts) == n, hosts
        wait_for(
            lambda: sorted(w["host"] for w in live_workers(self.url)) == sorted(hosts),
            60,
            f"{n} live workers, one in each worker container",
        )


def docker(*args: str, timeout: float = 60) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"docker {' '.join(args)}: {done.stderr}"
    return done.stdout


def inspect(container: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = json.loads(docker("inspect", container))
    return found[0]


def live_workers(url: str) -> list[dict[str, Any]]:
    try:
        response = httpx.get(url + "/v1/workers", timeout=2)
    except httpx.HTTPError:
        return []
    listed: list[dict[str, Any]] = response.json()["data"] if response.is_success else []
    return listed


def engine_compose() -> list[str]:
    """The compose command for a reachable engine; fails the test with what to do."""
    start = "start one with `bash scripts/dockerd.sh start` (root), or run `make test`"
    if shutil.which("docker") is None:
        pytest.fail(f"no docker command: install Debian's docker.io and {start}")
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        pytest.fail(f"no Docker engine answers ({info.stderr.strip()[-300:]}): {start}")
    v2 = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=60)
    if v2.returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.fail("neither `docker compose` nor `docker-compose` (Debian: docker-compose)")


def remove_stale_projects(command: list[str]) -> None:
    """Take down the projects of test runs that died before their ``down`` (their
    containers would come back with the engine: restart policy)."""
    listed = docker("ps", "-a", "--format", '{{.Label "com.docker.compose.project"}}')
    for project in set(listed.split()):
        match = re.fullmatch(rf"{PROJECT_PREFIX}(\d+)(-[a-z]+)?", project)
        if match and not alive(int(match.group(1))):
            Compose(command, project, 0)("down", "-v", "--remove-orphans", check=False)


@contextmanager
def project_up(
    file: Path,
    ready: Callable[[Compose], bool],
    what: str,
    *,
    suffix: str = "",
    env: Mapping[str, str] | None = None,
    seconds: float = 90,
) -> Iterator[Compose]:
    """``file`` brought up as a test project of its own (``up -d --build``, base images
    made first, stale test projects taken down) until ``ready`` says so, within
    ``seconds``; taken down with its volumes when the block ends. ``env``: what the
    file's variables are set to beyond the published API port."""
    command = engine_compose()
    base = subprocess.run(
        ["bash", str(ROOT / "scripts" / "standin-images.sh")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert base.returncode == 0, f"base images: {base.stderr[-2000:]}"
    remove_stale_projects(command)
    compose = Compose(command, f"{PROJECT_PREFIX}{os.getpid()}{suffix}", free_port(), file)
    compose.env.update(env or {})
    try:
        compose("up", "-d", "--build", timeout=600)
        try:
            wait_for(lambda: ready(compose), seconds, what)
        except NotReady as exc:
            raise AssertionError(f"{exc}\n{compose('logs', '--tail', '40', check=False)}") from None
        yield compose
    finally:
        compose("down", "-v", "--remove-orphans", timeout=180, check=False)


def sdk(compose: Compose) -> openai.OpenAI:
    """The openai SDK on the project's API."""
    return openai.OpenAI(base_url=compose.url + "/v1", api_key="unused", timeout=60, max_retries=0)
