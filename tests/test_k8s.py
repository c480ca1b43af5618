"""``deploy/k8s/``: Kubernetes objects checked against the official schemas
(``kubernetes-validate``, offline), KEDA's ScaledObjects against the fields KEDA
documents, and every llmq container against the real CLI and settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from api.exposition import DESIRED_WORKERS
from cli.main import SETTINGS, build_parser
from llmq.protocol import keys

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSION = "1.30.0"


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def objects() -> list[dict[str, Any]]:
    return [d for path in sorted(K8S.glob("*.yaml")) for d in documents(path)]


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects() if o["kind"] == kind}


@pytest.mark.parametrize("obj", objects(), ids=lambda o: f"{o['kind']}/{o['metadata']['name']}")
def test_valid_against_the_kubernetes_schemas(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_the_validator_bites() -> None:
    broken = by_kind("Deployment")["llmq-api"]
    broken = {**broken, "spec": {**broken["spec"], "replicas": "two"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def containers(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    found: list[dict[str, Any]] = spec["containers"]
    return found


def test_llmq_containers_run_real_subcommands_with_real_settings() -> None:
    llmq = [
        (d, c)
        for d in by_kind("Deployment").values()
        for c in containers(d)
        if c["image"].startswith("llmq:")
    ]
    assert {c["command"][1] for _, c in llmq} == {"api", "worker", "autoscale"}
    for deployment, container in llmq:
        command = container["command"]
        build_parser().parse_args(command[1:])
        env = {e["name"]: e["value"] for e in container["env"]}
        cls = SETTINGS[command[1]]
        unknown = [n for n in env if n.removeprefix("LLMQ_").lower() not in cls.model_fields]
        assert not unknown, (deployment["metadata"]["name"], unknown)
        cls(**{n.removeprefix("LLMQ_").lower(): v for n, v in env.items()})  # valid values


def test_probes_and_grace_periods() -> None:
    deployments = by_kind("Deployment")
    (api,) = containers(deployments["llmq-api"])
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    api_env = {e["name"]: float(e["value"]) for e in api["env"] if e["name"].endswith("SECONDS")}
    api_grace = deployments["llmq-api"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert api_grace > api_env["LLMQ_SHUTDOWN_GRACE_SECONDS"]
    worker = deployments["llmq-worker-mock"]
    (container,) = containers(worker)
    drain = float(next(e["value"] for e in container["env"] if e["name"] == "LLMQ_DRAIN_SECONDS"))
    assert worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > drain + 5
    assert deployments["llmq-autoscaler"]["spec"]["replicas"] >= 2  # the lease makes it safe


#: ScaledObject fields as KEDA documents them (keda.sh/docs, "Scaling Deployments").
SCALED_OBJECT_SPEC = {
    "scaleTargetRef", "pollingInterval", "cooldownPeriod", "initialCooldownPeriod",
    "idleReplicaCount", "minReplicaCount", "maxReplicaCount", "fallback", "advanced", "triggers",
}  # fmt: skip
TRIGGER_METADATA = {
    "prometheus": {
        "serverAddress", "query", "threshold", "activationThreshold", "namespace",
        "customHeaders", "ignoreNullValues", "queryParameters", "unsafeSsl",
    },
    "redis": {
        "address", "host", "port", "username", "password", "listName", "listLength",
        "activationListLength", "databaseIndex", "enableTLS", "unsafeSsl",
    },
}  # fmt: skip
REQUIRED_METADATA = {
    "prometheus": {"serverAddress", "query", "threshold"},
    "redis": {"listName"},
}


def check_scaled_object(obj: dict[str, Any]) -> dict[str, Any]:
    assert obj["apiVersion"] == "keda.sh/v1alpha1" and obj["kind"] == "ScaledObject"
    spec = obj["spec"]
    assert set(spec) <= SCALED_OBJECT_SPEC, set(spec) - SCALED_OBJECT_SPEC
    target = spec["scaleTargetRef"]["name"]
    assert target in by_kind("Deployment"), target
    for field in ("pollingInterval", "cooldownPeriod", "minReplicaCount", "maxReplicaCount"):
        assert isinstance(spec[field], int) and spec[field] >= 0, field
    assert spec["minReplicaCount"] <= spec["maxReplicaCount"]
    (trigger,) = spec["triggers"]
    metadata = trigger["metadata"]
    kind = trigger["type"]
    assert set(metadata) <= TRIGGER_METADATA[kind], set(metadata) - TRIGGER_METADATA[kind]
    assert REQUIRED_METADATA[kind] <= set(metadata)
    assert all(isinstance(v, str) for v in metadata.values()), "KEDA metadata values are strings"
    behavior = spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior")
    if behavior:  # an autoscaling/v2 HPA behavior: check it with the official schema
        hpa = {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "check"},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
                "maxReplicas": spec["maxReplicaCount"],
                "behavior": behavior,
            },
        }
        kubernetes_validate.validate(hpa, KUBERNETES_VERSION, strict=True)
    return dict(trigger)


def test_keda_scales_workers_on_the_published_desired_count() -> None:
    (obj,) = documents(K8S / "keda" / "scaledobject.yaml")
    trigger = check_scaled_object(obj)
    assert trigger["type"] == "prometheus"
    metadata = trigger["metadata"]
    assert DESIRED_WORKERS in metadata["query"] and 'model="mock"' in metadata["query"]
    assert metadata["threshold"] == "1"  # one replica per desired worker
    prometheus = by_kind("Service")["prometheus"]
    assert (
        metadata["serverAddress"] == f"http://prometheus:{prometheus['spec']['ports'][0]['port']}"
    )
    scrape = yaml.safe_load(by_kind("ConfigMap")["prometheus"]["data"]["prometheus.yml"])
    assert scrape["scrape_configs"][0]["static_configs"][0]["targets"] == ["llmq-api:8000"]


def test_prometheus_loads_the_rules_configmap_made_from_the_rules_folder() -> None:
    config = yaml.safe_load(by_kind("ConfigMap")["prometheus"]["data"]["prometheus.yml"])
    (rules,) = config["rule_files"]
    pod = by_kind("Deployment")["prometheus"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mount = next(m for m in container["volumeMounts"] if rules.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    name = volume["configMap"]["name"]
    # the command the manifest's comment gives makes it from the repository's rules
    made = f"kubectl create configmap {name} --from-file=deploy/prometheus/rules/"
    assert made in (K8S / "prometheus.yaml").read_text()
    assert list((K8S.parent / "prometheus" / "rules").glob(rules.rsplit("/", 1)[1]))


def test_keda_redis_fallback_counts_the_models_queue() -> None:
    (obj,) = documents(K8S / "keda" / "scaledobject-redis.yaml")
    trigger = check_scaled_object(obj)
    assert trigger["type"] == "redis"
    assert trigger["metadata"]["listName"] == keys.queue("mock")
    assert trigger["metadata"]["address"] == "redis:6379"
    assert int(trigger["metadata"]["listLength"]) >= 1
