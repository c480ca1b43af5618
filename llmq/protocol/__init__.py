"""The queue protocol: how a request goes from the API to a worker and out again.

Everything the API and the workers must do the same way is here; the API
(``api/admission/submit.py``) and the worker (``worker/queue_worker.py``) call it one step at
a time and assemble nothing of it. Each step below is one method of
:class:`~llmq.protocol.queue.Queue` and one atomic Lua script in ``lua/`` (loaded
by :mod:`llmq.protocol.scripts`, with the lease clock of ``lua/clock.lua``
prepended). Every script's keys share one hash slot (:mod:`llmq.protocol.keys`), and
every value a script and Python exchange is encoded and decoded in
:mod:`llmq.protocol.codec` and nowhere else. Read it in this order:

1. **Enqueue** (:meth:`Enqueue.of` builds what a validated job writes;
   :meth:`Queue.admit` writes it: one request alone, or the choices of one
   request, all or none). The request's record and its ``queued`` lifecycle note go
   first, in the request's slot (``record.lua``), with the tenant's quota take
   (:mod:`llmq.protocol.quota`, ``quota_take.lua``, in the tenant's slot). Then
   the model's slot admits or refuses it (``enqueue.lua``, ``enqueue_batch.lua``):
   admission is the queue bound; the job record (arq's format, which llmq writes
   itself: :mod:`llmq.protocol.arq_job` says why), the cost (prompt + max_tokens) and
   the queue deadline are written with the queue entry, scored by effective time
   (:func:`queue.effective_score`: arrival shifted by priority). If the queue was
   empty and a worker is *parked*, the script claims the request for that worker at
   once and publishes the claim on its hand-off channel (read by
   :func:`codec.parse_handoff`); otherwise it publishes a wake-up. A refused
   request's record and note go again (``unrecord.lua``). Whoever ends the request
   returns the quota it did not use (:meth:`Queue.give_back_quota`,
   ``quota_return.lua``).
2. **Claim** (:meth:`Queue.claim`, ``claim.lua``): a worker with a free slot takes the
   lowest score (under ``LLMQ_FAIRNESS=vtc``, the first request of the least-served
   tenant in the head's priority band: ``lua/fair.lua``). On the way, requests past
   their queue deadline or with their cancel flag set are dropped, and ended
   (:meth:`Queue.end_unstarted`); one that costs more than the worker's token budget
   left is skipped unless the worker is idle. The claimed request moves to the running
   set with a *lease* (:class:`codec.Lease`, in lease time) and its try counter is
   bumped: that attempt is the run's fencing token. The reply carries the job record
   (:func:`codec.parse_claim`), which the worker gives arq without reading it again
   (``worker/queue_worker.py``). A worker that leaves the queue empty with a slot free
   is parked, for step 1's hand-off.
3. **Lease** (:meth:`Queue.renew`, ``renew.lua``): every heartbeat renews the leases
   a worker holds and answers per request ``ok``, ``lost`` (another attempt owns it:
   stop without writing) or ``cancelled`` (:func:`codec.parse_renew`); it is also
   the beat that keeps a parked worker eligible for hand-offs. Leases are judged in
   lease time (``lua/clock.lua``): Redis's clock, advanced by at most 300 ms a call,
   so a stall or outage of Redis costs nobody a lease.
4. **Run** (``publish.lua``, the writes of many requests per call, which
   :func:`streams.publish_calls` builds; the batching publisher is
   ``worker/publisher.py``): every write of a run (tokens, record fields, lifecycle
   notes) carries its attempt and is refused once the request's fence
   (:func:`keys.fence`) is past it, so an attempt that lost its lease writes
   nothing. A re-run resumes after :func:`streams.published_tokens`.
5. **Finish or give back**:

   - *finish* (:meth:`Queue.finish`: :meth:`Queue.release`, ``release.lua``): the
     run ended; its job, try counter and in-progress marker go, and its lease, if
     its attempt still holds it.
   - *requeue* (:meth:`Queue.requeue`, ``requeue.lua`` then ``fence.lua``): a
     stopping worker, or one handed a request it has no slot for, puts it back at
     its original score, and the fence rises past the attempt.
   - *reap* (:meth:`Queue.reap`, ``reap.lua``, ``fence.lua``, ``reap.lua``): a lease
     that ran out in lease time (its worker died or is cut off) is fenced, then the
     request is requeued.
   - *cancel* (:meth:`Queue.cancel`, ``cancel.lua``): a queued request is removed
     and ended; a running one gets a flag, which its worker hears by message or at
     its next renewal.
   - *sweep* (:func:`sweep.sweep_forever`, in every API and worker process): expires
     queued requests past their deadline (:meth:`Queue.sweep`, ``sweep.lua``), reaps
     (above), and cancels requests attached to API processes whose lease ran out
     (:meth:`Queue.cancel_orphans`, ``orphans.lua``; that lease:
     :meth:`Queue.api_beat`, ``api_beat.lua``). A request that ends without starting
     gets its terminal event and record from :meth:`Queue.end_unstarted`
     (:mod:`llmq.protocol.streams`).

A step that writes two slots is two calls, ordered so that a crash between them
leaves nothing anyone sees or something the next sweep repairs; the methods'
docstrings argue each. Not a step of a request: ``worker_beat.lua``, the worker
registry's heartbeat (:mod:`llmq.registry`), and the queue's depth, read for the
metrics endpoint (:mod:`llmq.protocol.depth`).
"""
