"""A real Prometheus scrapes ``/metrics``, computes a TTFT percentile, evaluates the rules.

This proves the exposition is what Prometheus accepts (not only what
prometheus_client's parser accepts), that the histogram works with
``histogram_quantile``, and that the objectives' ``le`` bounds in
deploy/prometheus/rules/ name buckets ``/metrics`` really has. Debian's
``prometheus`` package provides the binary (``scripts/system-deps.sh`` installs it in
CI); without it the test is skipped.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from llmq.embedded import free_port
from tests.support.servers import RunningApi
from tests.support.waiting import wait_until

PROMETHEUS = shutil.which("prometheus")
QUERY = "histogram_quantile(0.5, sum(rate(llmq_time_to_first_token_seconds_bucket[30s])) by (le))"
RULES = Path(__file__).resolve().parent.parent / "deploy" / "prometheus" / "rules"
#: Each objective's error ratio: a number (0 here) only if its ``le`` names a real bucket.
RATIOS = "llmq:slo_errors:ratio_rate5m"


def _config(target: str) -> str:
    return f"""
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: ["{RULES}/*.yml"]
scrape_configs:
  - job_name: llmq
    scrape_interval: 1s
    static_configs:
      - targets: ["{target}"]
"""


@pytest.mark.timeout(90)
@pytest.mark.skipif(
    PROMETHEUS is None,
    reason="the prometheus binary is not installed (Debian package prometheus; "
    "scripts/system-deps.sh installs it)",
)
async def test_prometheus_computes_ttft_quantile(stack: RunningApi, tmp_path: Path) -> None:
    assert PROMETHEUS is not None
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(_config(f"127.0.0.1:{stack.settings.port}"))
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        async with (
            stack.client() as client,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as prom,
        ):

            async def ttft_median() -> bool:
                # keep traffic flowing so that the rate over 30 s is not zero
                body = {"model": "mock", "prompt": "hi", "max_tokens": 2}
                assert (await client.post("/v1/completions", json=body)).status_code == 200
                try:
                    r = await prom.get("/api/v1/query", params={"query": QUERY})
                except httpx.HTTPError:
                    return False  # not listening yet
                if proc.poll() is not None:
                    raise AssertionError((tmp_path / "prometheus.log").read_text())
                if r.status_code == 503:
                    return False  # listening, still starting up ("Service Unavailable")
                result = r.json().get("data", {}).get("result", [])
                if not result:
                    return False
                value = float(result[0]["value"][1])
                return value == value and value > 0  # not NaN

            await wait_until(
                ttft_median, timeout=60, interval=0.2, what="Prometheus to compute the TTFT p50"
            )
            ratios: dict[str, float] = {}

            async def objectives_evaluated() -> bool:
                body = {"model": "mock", "prompt": "hi", "max_tokens": 2}
                assert (await client.post("/v1/completions", json=body)).status_code == 200
                r = await prom.get("/api/v1/query", params={"query": RATIOS})
                for sample in r.json()["data"]["result"]:
                    ratios[sample["metric"]["slo"]] = float(sample["value"][1])
                return len(ratios) == 2 and all(v == v for v in ratios.values())  # not NaN

            await wait_until(
                objectives_evaluated, timeout=20, interval=0.2, what="the objectives' ratios"
            )
            assert ratios == {"queue_wait": 0.0, "ttft": 0.0}  # the mock answers at once
    finally:
        proc.kill()
        proc.wait(10)
        log.close()
