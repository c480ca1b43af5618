"""The mock's engine model, after vLLM's split: the KV cache with its prefix cache
(``kv_cache.py``), the scheduler that uses it (``scheduler.py``), the clock that
times its steps (``loop.py``) and the named figures it runs with (``profiles.py``);
see docs/routing.md, "The mock engine"."""
