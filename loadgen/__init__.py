"""llmq's load generator: OpenAI-compatible streaming traffic, measured like ``vllm bench serve``.

Programmatic use (the benchmark suite)::

    from loadgen import LoadConfig, run_load

    result = await run_load(LoadConfig(base_url="http://127.0.0.1:8000",
                                       request_rate=20, num_requests=500, seed=1))
    figures = result.summary()

``run_load(config, target=None) -> RunResult`` sends the traffic to
``config.base_url`` or, with ``in_process=True``, to the prototype's baseline server
in this process (:mod:`loadgen.baseline`), the same arrivals, prompts and lengths
for both (``target`` takes any :class:`loadgen.runner.Target` instead).
:class:`RunResult` holds ``config``, ``measurements`` (one
:class:`RequestMeasurement` per measured request, index order), ``warmup_measurements``,
``duration_s``, ``started_at`` (Unix time), ``target`` (``"http"`` or
``"in_process"``), ``lagged`` and:

* ``summary() -> dict``: flat figures: ``completed``, ``failed``, ``requests``,
  ``failures`` ({kind: count} over ``http_429``, ``http_4xx``, ``http_5xx``,
  ``timeout``, ``connection``, ``server_error``, ``other``), ``duration_s``,
  ``request_throughput``, ``output_throughput``, ``total_token_throughput``
  (per second), ``goodput`` and ``good_requests`` (None without SLOs),
  ``total_input_tokens``, ``total_output_tokens``, ``peak_in_flight``,
  ``{ttft,tpot,itl,e2el,lag}_ms_{mean,median,std,max,p50,p90,p99}`` (None when
  there is no value; more ``p`` keys from ``config.percentiles``, ``p99_9`` for
  99.9), ``lagged``, ``lag_threshold_ms``, ``by_priority`` ({"0": {...}, ...}
  with completed, failed, ttft/e2el median and p99), ``target``, ``warmup``,
  ``max_concurrency``;
* ``to_json() -> dict``: settings, summary, ``lagged`` and every measurement.

Modules: :mod:`~loadgen.config` (settings), :mod:`~loadgen.arrivals` (schedule),
:mod:`~loadgen.workload` (prompts), :mod:`~loadgen.sse` and :mod:`~loadgen.client`
(HTTP target), :mod:`~loadgen.baseline` (in-process target), :mod:`~loadgen.measurements`
(measurement), :mod:`~loadgen.runner` (driving), :mod:`~loadgen.figures`,
:mod:`~loadgen.report`, :mod:`~loadgen.plots`, :mod:`~loadgen.cli`.
"""

from loadgen.config import LoadConfig
from loadgen.measurements import FAILURE_KINDS, RequestMeasurement
from loadgen.result import RunResult
from loadgen.runner import run_load

__all__ = ["FAILURE_KINDS", "LoadConfig", "RequestMeasurement", "RunResult", "run_load"]
