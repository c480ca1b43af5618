"""The llmq HTTP API: OpenAI-compatible and native endpoints over the Redis queue.

An API process admits a request into the queue (:mod:`llmq.protocol`, whose own
map walks the queue's side) and relays what a worker writes to the request's
stream; it keeps nothing another replica lacks, so any replica can serve any
client. Read it in the order a request meets it:

0. **The process** (``main.py``: uvicorn serving the app, one process or several on
   one port; ``app.py``: the FastAPI app, whose lifespan opens and closes every
   resource of ``state.py`` (Redis clients, relay, catalog, metrics tally,
   background tasks) and keeps this process's liveness lease, on which its attached
   requests depend; ``traced.py``: while tracing is on, the request's span, continuing
   the client's ``traceparent``, and its relay's).
1. **Body and auth** (``admission/limits.py``: a middleware that answers 413 to a body over
   the limit before anything parses it; ``admission/auth.py``: the bearer key, and the digest
   of it that a request records as its owner; ``admission/tenancy.py``: the tenant a request
   belongs to, by its key or a trusted header, cached for a second).
2. **Route** (``routes/openai.py``: completions, chat completions, models;
   ``routes/responses.py``: OpenAI's Responses API, served on the chat path;
   ``routes/embeddings.py``: embeddings, one queued request for all inputs;
   ``routes/native.py``: submit now, status, follow and resume the event stream,
   cancel; ``routes/health.py`` and ``routes/metrics.py`` for probes and scrapers);
   ``openapi.py`` makes the OpenAPI document list the statuses each route answers.
   The generation routes are ``direct_route.py``'s: they fill their parameters
   (body, caller, session header) themselves, without FastAPI's per-request
   resolution, which is on every first token's path.
3. **Validation and admission**: the body is checked strictly against
   ``bodies.py``; ``extras.py`` reads what it asks beyond plain text (structured
   output, tools, log-probabilities) and the capability each needs; ``admission/submit.py``
   checks everything that can refuse it before anything is written: the limits
   that are settings, and the model, against ``catalog.py`` (the models live
   workers serve and their capabilities, refreshed off the request path). Under a
   routed policy, ``chat_render.py`` asks a worker's engine to render a chat
   request's messages, so that its block names are those of the model's template. Every
   refusal is an error of ``errors.py``: OpenAI's error shape, registered in one
   place, where Redis errors become 503 and an exhausted pool 429. A request's
   admission is one object (``admission/admission.py``), made at auth and passed
   along: its tenant, the policy it reads (one snapshot) and each verdict.
   ``admission/flow.py`` is
   flow control at admission: a tenant's priority ceiling, its quota (429
   ``rate_limit_exceeded``) and shedding by expected wait.
4. **Enqueue**, the end of admission: the request becomes one queued request per
   choice, written all or none by one call of :meth:`llmq.protocol.queue.Queue.admit`.
5. **Relay**: ``streams/relay.py`` is the process's one ``XREAD`` loop, fanning the entries
   of every followed stream out to per-client subscriptions (``streams/subscription.py``:
   one stream's entries after an id, in order, bounded); it packs its command from
   RESP kept per stream (``streams/resp.py``) and decodes token events on a fast path
   (``entries.py``). ``streams/grouped_relay.py`` runs one such reader per request group
   on a Redis Cluster. ``streams/follow.py`` follows one request's subscription: events in
   order, each token once, ending after the terminal event; ``streams/fanin.py`` merges
   the choices of one response. A Responses request is translated into the chat
   request it runs (``responses/responses_input.py``), followed by ``responses/responses_relay.py``,
   shaped into Response objects and typed events (``responses/responses_format.py``) and
   kept for ``previous_response_id`` (``responses/responses_store.py``).
6. **Framing**: ``streams/event_stream.py`` frames Server-Sent Events and writes the stream
   to the client; ``openai_format.py`` shapes events into OpenAI's chunks and bodies
   (the native route writes the events as they are, with their stream ids);
   ``timing.py`` records TTFT and latency as the client sees them.
7. **Cancel on disconnect** (``cancel.py``): a client that leaves an OpenAI route
   cancels its request, in a background task the app state owns; ``DELETE
   /v1/requests/{id}`` cancels a native one. Requests attached to an API process
   that died are cancelled by the sweep once its liveness lease runs out.

Beside the request path, the Batch API: ``routes/files.py`` and ``batch/files.py`` store a
batch's input and output files in Redis; ``routes/batches.py`` creates, lists and
cancels batches, whose state ``batch/batch_store.py`` keeps; ``batch/batch_lines.py`` validates
every line first; ``batch/batch_feeder.py`` (one API process at a time, under a lease)
feeds lines into the batch band on idle capacity and collects each line's answer
once, by ``batch/batch_run.py``, which admits a line through the live routes' own code.

For operators, the admin API and its console: ``admin.py`` checks the admin key
(apart from every tenant's) and writes each action to the audit trail;
``routes/admin.py`` serves the pool (``pool_view.py``: each model's workers and queue)
and the audit trail, ``routes/admin_requests.py`` every tenant's requests
(``request_list.py``: filtered, bounded pages) and cancels them,
``routes/admin_tenants.py`` tenants and keys, ``routes/admin_batches.py`` every
tenant's batches, ``routes/admin_policy.py`` the pool policy (read and changed through
:mod:`llmq.policy`); ``routes/console.py`` serves the console's pages (``console/``:
templates and one script that calls the admin API).

The metrics endpoints read the totals every process
flushed to Redis (``totals.py``): ``exposition.py`` renders them for Prometheus,
``summary.py`` as JSON with estimated percentiles and rates.
"""
