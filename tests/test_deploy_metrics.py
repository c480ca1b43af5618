"""The deploy/ files (Prometheus config and rules, Grafana dashboard) name only real metrics.

A renamed metric would otherwise leave a dashboard panel silently empty, or an alert
silent: every ``llmq_*`` name in those files must appear in a live ``/metrics`` answer.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from llmq import metrics
from tests.support.servers import RunningApi
from tests.support.waiting import wait_until

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
PROMETHEUS = DEPLOY / "prometheus"
FILES = [
    PROMETHEUS / "prometheus.yml",
    *sorted((PROMETHEUS / "rules").glob("*.yml")),
    *sorted((DEPLOY / "grafana").rglob("*.json")),
]
NAME = re.compile(r"\bllmq_[a-z0-9_]+")


def exposed(text: str) -> set[str]:
    """Families and samples; a counter family without samples yet still names its ``_total``."""
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(s.name for s in family.samples)
        if family.type == "counter":
            names.add(f"{family.name}_total")
    return names


def test_dashboard_is_valid_json_with_queries() -> None:
    dashboards = sorted((DEPLOY / "grafana").rglob("*.json"))
    assert dashboards
    for path in dashboards:
        board = json.loads(path.read_text())
        panels = [p for p in board["panels"] if p["type"] != "row"]
        exprs = [t["expr"] for p in panels for t in p["targets"]]
        assert all(p["targets"] for p in panels) and exprs, path
        assert all(NAME.search(e) for e in exprs), path


def test_dashboard_repeats_a_row_per_tenant_and_has_one_for_batches() -> None:
    board = json.loads((DEPLOY / "grafana" / "dashboards" / "llmq.json").read_text())
    (variable,) = board["templating"]["list"]
    assert variable["name"] == "tenant" and "llmq_tenant_" in variable["definition"]
    rows = [i for i, p in enumerate(board["panels"]) if p["type"] == "row"]
    sections = {
        board["panels"][i]["title"]: board["panels"][i + 1 : j]
        for i, j in zip(rows, [*rows[1:], len(board["panels"])], strict=True)
    }
    tenant = next(board["panels"][i] for i in rows if board["panels"][i].get("repeat"))
    assert tenant["repeat"] == "tenant"
    for panel in sections[tenant["title"]]:
        assert all('tenant="$tenant"' in t["expr"] for t in panel["targets"]), panel["title"]
    batch_exprs = " ".join(t["expr"] for p in sections["Batches"] for t in p["targets"])
    assert "llmq_batch_lines_total" in batch_exprs and "llmq_batches_total" in batch_exprs


def test_prometheus_config_scrapes_the_api() -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == ["api:8000"]
    assert config["rule_files"] == ["rules/*.yml"]  # docker-compose.yml mounts the folder


async def test_every_metric_named_in_deploy_files_is_exposed(stack: RunningApi) -> None:
    used = {name for path in FILES for name in NAME.findall(path.read_text())}
    assert "llmq_time_to_first_token_seconds_bucket" in used
    async with stack.client() as client:
        body = {"model": "mock", "prompt": "hello", "max_tokens": 3}
        assert (await client.post("/v1/completions", json=body)).status_code == 200

        async def flushed() -> bool:
            text = (await client.get("/metrics")).text
            return f"{metrics.E2E.name}_count" in exposed(text) and "llmq_requests_total" in text

        await wait_until(flushed, timeout=10, what="the request's metrics to be flushed")
        names = exposed((await client.get("/metrics")).text)
    assert used <= names, sorted(used - names)
