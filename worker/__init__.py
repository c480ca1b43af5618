"""The llmq worker: an arq worker that runs the model and publishes token streams.

A worker serves one model. It finds work through the queue protocol
(:mod:`llmq.protocol`, whose own map walks the same steps from the queue's side)
and keeps arq's job machinery (tries, timeouts, cancellation on shutdown). Read it
in the order a worker's life and a request's run go:

1. **Start-up and registration** (``main.py``): :func:`~worker.main.serve` owns
   every resource and task it starts: the Redis pool (on a Redis Cluster, to the
   node of the model's slot), the backend, the model object it runs (``backends/``:
   the factory that ``LLMQ_BACKEND`` picks from, and the adapter to an
   OpenAI-compatible inference server with its health watch; ``mock.py``: the mock,
   timing without a GPU, running on a small engine model, ``mock_engine/``: continuous
   batching and a KV prefix cache; ``structured.py``: its schema-valid JSON, tool
   arguments and log-probabilities; ``embedding.py``: its deterministic embedding
   vectors), the publisher, the runner and the queue worker. After the model's load
   time its heartbeat registers the worker, with the capabilities its model
   declares, in :mod:`llmq.registry`, where the API's catalog finds it.
2. **Wake-up, park, hand-off**: one pub/sub connection per worker, the listener
   that ``serve`` starts, hears wake-ups, cancels and hand-offs. The claim loop of
   ``queue_worker.py`` waits for a wake-up (or a slot that freed; polling is the
   fallback); a worker that leaves the queue empty with a slot free is parked, and
   the API's enqueue script may then claim a request for it and hand it over on
   the worker's own channel.
3. **Claim**: one request per free slot, lowest score first, within the worker's
   token budget (:meth:`~llmq.protocol.queue.Queue.claim`); the claim already read
   the job record, which ``queue_worker.py`` hands to arq's ``run_job`` instead of
   a round trip of its own. That module is also where every way the worker goes
   around arq is listed, with why, what it buys and what an arq upgrade must
   re-check.
4. **Lease renewal**: every heartbeat renews the leases of the requests the worker
   holds, together with its registry entry; a request reported ``lost`` is fenced
   (stopped without writing), one reported ``cancelled`` is cancelled. A worker
   that cannot renew times each lease by its own clock (``leases.py``) and pauses
   the generation when it would expire, so a cut-off worker stops spending its
   model on tokens nobody will read. Under a
   routing policy the beat also publishes the worker's load, its pace (``pace.py``:
   how long a run holds a slot and a prompt block's prefill takes, measured from its
   runs, which the adaptive load guard weighs) and what its KV cache gained and lost
   (``cache_report.py``), which routed claims and hand-offs read.
5. **Run** (``runner.py``): the model's tokens become events on the request's
   stream: ``started``, ``tokens``, then exactly one terminal event; a cancel, a
   timeout, a model error or a lost lease each ends the run its own way. Each run
   is one object (``run.py``: :class:`~worker.run.Run`) whose status (running,
   pausing, handing back, fenced, cancelled, finished, unfinished) moves only by
   its own methods, each of which says from which states it may.
6. **Publish** (``publisher.py``): every stream's pending events go out in one
   fenced script call per flush, coalesced while a flush is in flight, kept and
   retried through a Redis outage.
7. **Release or requeue**: a finished run is released
   (:meth:`~llmq.protocol.queue.Queue.finish`); one the worker could not finish
   goes back to the queue at its original score
   (:meth:`~llmq.protocol.queue.Queue.requeue`), each only while its attempt
   still holds the lease.
8. **Drain**: on SIGTERM/SIGINT the worker stops claiming and unparks, gives
   running requests ``drain`` seconds, cancels (and so requeues) the rest, then
   flushes its metrics and unregisters.
"""
