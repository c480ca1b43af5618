"""docker-compose.yml is valid and each llmq service runs a real ``llmq`` subcommand.

The file is checked statically here, in a second: by ``docker-compose config``
(Debian's docker-compose package, installed by ``.ci/run``) when available, and by
reading the YAML in every case. ``test_compose_stack.py`` runs it on an engine.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from cli.main import build_parser
from tests.support.compose import needs_docker_compose, resolved

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"


def subcommands() -> set[str]:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return set(action.choices or ())


def is_llmq(service: dict[str, Any]) -> bool:
    """Built from this repository (``image: llmq:...``); Redis, Prometheus... are not."""
    return str(service.get("image", "")).startswith("llmq:")


def seconds(duration: str | int | float) -> float:
    """A compose duration (``30s``, ``1m30s``, ``1500ms``) in seconds."""
    if isinstance(duration, int | float):
        return float(duration)
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"([\d.]+)(h|ms|us|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Target -> host path of a service's bind mounts, short or long syntax."""
    out = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        else:
            source, target = volume["source"], volume["target"]
        if source.startswith((".", "/")):
            out[target] = (COMPOSE.parent / source).resolve()
    return out


def check_prometheus(service: dict[str, Any]) -> None:
    """Its config (deploy/prometheus/prometheus.yml) and the rules it names are mounted."""
    assert "--config.file=/etc/prometheus/prometheus.yml" in service["command"]
    folder = mounts(service)["/etc/prometheus"]
    config = yaml.safe_load((folder / "prometheus.yml").read_text())
    assert all(list(folder.glob(g)) for g in config["rule_files"]), config["rule_files"]


def check(config: dict[str, Any]) -> None:
    services = config["services"]
    assert {"redis", "api", "worker", "prometheus", "grafana"} <= set(services)
    commands = subcommands()
    for name, service in services.items():
        if not is_llmq(service):
            continue
        command = service["command"]
        assert command[0] == "llmq" and command[1] in commands, (name, command)
        env = service["environment"]
        assert all(k.startswith("LLMQ_") for k in env), env
        build_parser().parse_args(command[1:])  # flags, if any, are real
    assert "ports" not in services["redis"], "Redis must not be published"
    assert services["api"]["ports"], "the API publishes its port"
    for name in ("api", "worker"):
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"
        # pip reaches the package index on the host's network: no container network
        # needs a route off the machine (scripts/dockerd.sh gives them none)
        assert services[name]["build"]["network"] == "host", name
    assert "healthcheck" in services["redis"]
    redis_command = " ".join(services["redis"]["command"])
    assert "--appendonly yes" in redis_command, "queued requests survive a restart with AOF"
    worker = services["worker"]
    drain = float(worker["environment"]["LLMQ_DRAIN_SECONDS"])
    assert seconds(worker["stop_grace_period"]) > drain, "the stop grace outlasts the drain"
    for name, service in services.items():  # every service is long-running
        assert service.get("restart") in ("unless-stopped", "always", "on-failure"), name
    assert "ports" not in services["worker"], "workers must scale without port clashes"
    assert "container_name" not in services["worker"]
    default = {n for n, s in services.items() if not s.get("profiles")}
    publishing = {n for n in default if services[n].get("ports")}
    assert publishing == {"api"}, f"`docker compose up` must publish only the API: {publishing}"
    check_prometheus(services["prometheus"])
    for name, port in (("prometheus", 9090), ("grafana", 3000)):
        assert services[name]["profiles"] == ["monitoring"], name
        published = [str(p) for p in services[name].get("ports", [])]
        assert len(published) == 1 and str(port) in published[0], (name, published)


def test_compose_file_statically() -> None:
    check(yaml.safe_load(COMPOSE.read_text()))


@needs_docker_compose
def test_docker_compose_config() -> None:
    check(resolved(COMPOSE))
