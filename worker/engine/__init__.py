"""The mock's engine model: a KV cache with a prefix cache (``kv_cache``), the
scheduler that uses it (``scheduler``), the clock that times its steps (``loop``) and
the named figures it runs with (``profiles``); see docs/routing.md, "The mock engine"."""
