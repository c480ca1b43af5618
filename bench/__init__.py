"""llmq's benchmark suite: ``python -m bench`` (``make bench``).

Each scenario starts the real processes it needs (an embedded Redis, ``llmq
api``, N ``llmq worker``), drives them with :mod:`loadgen`, stops them, and
reports medians over repeated runs, with the compared systems run in turns so
that the noise of a shared machine hits both sides of every comparison:

* ``light``: TTFT/E2E at light load, llmq against the in-process baseline;
* ``pickup``: queue wait, a stock arq worker (polling) against llmq (woken);
* ``scaling``: throughput of 1, 2 and 4 workers under saturating load;
* ``overload``: a burst beyond capacity, bounded queue + 429 against the
  baseline's unbounded busy-wait;
* ``capacity``: the most concurrent streams held with ITL intact, llmq (1 and 2
  API processes) against the floor (:mod:`bench.floor`, a bare in-process
  server), with CPU per delivered token by process.

Results go to ``<UTC timestamp>.json`` (every figure, the settings, the machine)
and ``.md`` (tables; also copied to ``latest.md``) under ``--out``, by default
``~/.cache/llmq/bench-results`` (:func:`bench.report.results_dir`), outside the
checkout. ``bench/results/<scenario>.md`` holds the one result per scenario that
the docs cite, made with ``--out bench/results --name <scenario>``.

Modules: :mod:`~bench.floor` (the floor server), :mod:`~bench.procs`
(processes), :mod:`~bench.sysinfo` (machine and CPU accounting),
:mod:`~bench.traffic` (loadgen runs), :mod:`~bench.stats` (medians, paired ratios),
:mod:`~bench.report` (files, tables),
:mod:`~bench.scenario` (the scenario contract), :mod:`~bench.scenarios` (one
module each), :mod:`~bench.stock_arq` and :mod:`~bench.health_probe` (helper
processes), :mod:`~bench.cli` (the command).
"""
