"""The ``llmq`` command and what sits above every process it starts.

The shell (:mod:`cli.main`), ``llmq run``'s stack (:mod:`cli.stack`), the process
supervisor (:mod:`cli.supervisor`) and the autoscaler's local driver
(:mod:`cli.local_driver`). They import the API, the worker and the load generator;
the shared contract (:mod:`llmq`) imports none of them.
"""
