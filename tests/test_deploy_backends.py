"""The examples that pair each worker with an inference server, checked statically:
``deploy/compose/llamacpp.yml`` (llama.cpp on CPU) and ``deploy/k8s/worker-vllm.yaml``
(vLLM on a GPU node; its Kubernetes schema check is tests/test_k8s.py's, which reads
every file there). Each worker must drive its own server, with real settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from cli.main import build_parser
from llmq.settings import WorkerSettings
from tests.support.compose import needs_docker_compose, resolved
from worker.backends import build_backend

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "deploy" / "compose" / "llamacpp.yml"
VLLM = ROOT / "deploy" / "k8s" / "worker-vllm.yaml"


def worker_settings(env: dict[str, str]) -> WorkerSettings:
    """The worker's settings from its environment; the factory accepts them."""
    fields: dict[str, Any] = {k.removeprefix("LLMQ_").lower(): v for k, v in env.items()}
    settings = WorkerSettings(**fields)
    assert settings.backend == "openai"
    build_backend(settings)  # an upstream model, not yet contacted
    return settings


def check_compose(config: dict[str, Any]) -> None:
    services = config["services"]
    workers = {
        n: s for n, s in services.items() if s.get("command", [None])[:2] == ["llmq", "worker"]
    }
    assert len(workers) >= 2, "two pairs show the horizontal scaling"
    upstreams = set()
    for name, service in workers.items():
        build_parser().parse_args(service["command"][1:])
        settings = worker_settings({k: str(v) for k, v in service["environment"].items()})
        host = urlsplit(settings.upstream_url).hostname
        assert host in services, (name, host)
        assert service["depends_on"][host]["condition"] == "service_healthy"
        assert settings.upstream_engine == "llamacpp"
        upstreams.add(host)
        llama = services[host]
        command = [str(part) for part in llama["command"]]
        assert "--parallel" in command, "the server's slots are the worker's cap"
        assert str(urlsplit(settings.upstream_url).port) == command[command.index("--port") + 1]
        assert "health" in " ".join(llama["healthcheck"]["test"])
    assert len(upstreams) == len(workers), "each worker drives its own server"
    assert services["api"]["ports"] and "ports" not in services["redis"]


def test_compose_llamacpp_statically() -> None:
    check_compose(yaml.safe_load(COMPOSE.read_text()))


@needs_docker_compose
def test_compose_llamacpp_config() -> None:
    check_compose(resolved(COMPOSE))


def test_vllm_worker_drives_the_engine_in_its_pod() -> None:
    (deployment,) = [d for d in yaml.safe_load_all(VLLM.read_text()) if d]
    spec = deployment["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in spec["containers"]}
    engine, worker = containers["vllm"], containers["worker"]
    flags = dict((a.removeprefix("--") + "=").split("=")[:2] for a in engine["args"])
    settings = worker_settings({e["name"]: e["value"] for e in worker["env"]})
    url = urlsplit(settings.upstream_url)
    assert url.hostname == "127.0.0.1" and str(url.port) == flags["port"], "the pod's own engine"
    assert settings.upstream_engine == "vllm"
    assert settings.upstream_slots == int(flags["max-num-seqs"]), "cap = the engine's slots"
    assert settings.model == flags["served-model-name"]
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert spec["terminationGracePeriodSeconds"] > settings.drain_seconds + 5
    assert engine["livenessProbe"]["httpGet"]["path"] == "/health"
