"""Switch off each guarded feature in a copy of the repository and check the tests notice.

Every entry of :data:`MUTANTS` names one guarantee the documentation states, the exact
text in the code that provides it, a replacement that switches it off, and the
tests that must then fail. The runner copies the working tree (uncommitted
changes included) to a temporary directory, first runs every selected test there
unmodified (they must pass), then applies one mutant at a time, runs its tests and
restores the file. A mutant whose tests still pass *survived*: the guarantee has
no test that bites. ``old`` text that is not found exactly once is reported as
``stale`` (the code moved on; retarget the entry), never silently skipped.

    python -m scripts.mutants            # all, table on stdout, exit 1 unless all killed
    python -m scripts.mutants --list
    python -m scripts.mutants --only relay-index-skip --only hand-back-score

``make mutants`` runs it; it is not part of ``make test``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Not copied: environments, caches, results.
IGNORED = (".venv", ".git", ".mypy_cache", ".ruff_cache", ".pytest_cache", "__pycache__")


@dataclass(frozen=True)
class Mutant:
    name: str
    guarantee: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


CONTRACT = "tests/test_readme_contract.py"
ALERT_RULES = "deploy/prometheus/rules/llmq.rules.yml"
ALERT_TESTS = "tests/test_alert_rules.py::test_the_rules_pass_their_unit_tests"
ADMIN_TESTS = "tests/test_admin.py"

#: One entry per guarantee. To retarget after a refactor, change ``path``/``old``/``new``.
MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "admin-key-required",
        "the admin API answers only an admin key: no key or a wrong one is 401",
        "api/admin.py",
        "    if found is not None:\n        return Admin(digest(given), found.name)",
        "    if True:\n        return Admin(digest(given), 'anyone')",
        (f"{ADMIN_TESTS}::test_the_admin_api_refuses_no_key_a_wrong_key_and_a_tenants_key",),
    ),
    Mutant(
        "admin-tenant-key-403",
        "a tenant's key on the admin API is 403, told apart from no key",
        "api/admin.py",
        "    if await _tenant_key(state, given):",
        "    if False:",
        (f"{ADMIN_TESTS}::test_the_admin_api_refuses_no_key_a_wrong_key_and_a_tenants_key",),
    ),
    Mutant(
        "admin-audit-write",
        "every admin action is appended to the audit trail, with who did it",
        "llmq/admin.py",
        "    await redis.xadd(\n        keys.AUDIT,",
        "    return\n    await redis.xadd(\n        keys.AUDIT,",
        (f"{ADMIN_TESTS}::test_every_admin_action_is_in_the_audit_trail_with_who_did_it",),
    ),
    Mutant(
        "admin-audit-cap",
        "the audit trail is capped at about AUDIT_MAXLEN entries",
        "llmq/admin.py",
        "        maxlen=AUDIT_MAXLEN,\n        approximate=True,\n",
        "",
        (f"{ADMIN_TESTS}::test_the_audit_trail_is_capped",),
    ),
    Mutant(
        "admin-list-bound",
        "a listing of requests holds at most its limit, whatever the queue holds",
        "api/request_list.py",
        "return Page(matched[:limit],",
        "return Page(matched,",
        (f"{ADMIN_TESTS}::test_listings_are_bounded_with_a_queue_of_a_thousand",),
    ),
    Mutant(
        "handoff-version-floor-worker",
        "no hand-off to a worker parked under a policy version below its model's floor",
        "llmq/protocol/lua/enqueue.lua",
        "or (tonumber(version) >= 0 and tonumber(version) < floor) then",
        "then",
        ("tests/test_handoff.py::test_no_hand_off_under_a_policy_version_below_the_models",),
    ),
    Mutant(
        "handoff-terms-without-version",
        "a worker whose parked terms name no policy version is still handed requests",
        "llmq/protocol/lua/enqueue.lua",
        "if not free then  -- parked by a worker of the release before",
        "if false then  -- parked by a worker of the release before",
        ("tests/test_handoff.py::test_terms_without_a_policy_version_are_still_handed_requests",),
    ),
    Mutant(
        "handoff-version-floor-api",
        "no hand-off by an API process whose policy version is below the model's floor",
        "llmq/protocol/lua/enqueue.lua",
        "if handing and (policy_version < 0 or policy_version >= floor) then",
        "if handing then",
        ("tests/test_handoff.py::test_no_hand_off_under_a_policy_version_below_the_models",),
    ),
    Mutant(
        "admin-worker-pace",
        "the pool shows each worker's pace as its routing beats publish it",
        "api/pool_view.py",
        "pace.update(zip(ids, await paces(state.redis, model, ids), strict=True))",
        "pass",
        (f"{ADMIN_TESTS}::test_the_pool_shows_each_workers_pace_and_the_batches_their_rate",),
    ),
    Mutant(
        "admin-batch-rate",
        "a batch's rate is its lines ended per minute from its start to its end",
        "api/routes/admin_batches.py",
        "until = min([t for t in ended if t is not None], default=now)",
        "until = now",
        (f"{ADMIN_TESTS}::test_the_pool_shows_each_workers_pace_and_the_batches_their_rate",),
    ),
    Mutant(
        "tenant-minute-history",
        "a tenant's usage per minute over the last hour is kept (GET /admin/tenants)",
        "llmq/metrics.py",
        "                if name in PER_MINUTE:",
        "                if False:",
        (f"{ADMIN_TESTS}::test_a_tenants_usage_over_the_last_hour_is_kept_per_minute",),
    ),
    Mutant(
        "tenant-minute-ttl",
        "a minute of tenants' usage expires after the hour",
        "llmq/protocol/lua/metrics_flush.lua",
        "  redis.call('EXPIRE', minute_key, minute_ttl)",
        "",
        (f"{ADMIN_TESTS}::test_a_tenants_usage_over_the_last_hour_is_kept_per_minute",),
    ),
    Mutant(
        "tenant-minute-window",
        "the last hour shows sixty minutes, none older",
        "llmq/tenant_usage.py",
        "    first = current - HOUR_MINUTES + 1\n",
        "    first = current - HOUR_MINUTES\n",
        (f"{ADMIN_TESTS}::test_a_tenants_usage_over_the_last_hour_is_kept_per_minute",),
    ),
    Mutant(
        "admin-policy-audit",
        "a policy change made through the admin API is in the audit trail",
        "api/routes/admin_policy.py",
        '    await audit(state, who, "policy.change", model or "pool", **changed)\n',
        "",
        (
            f"{ADMIN_TESTS}::test_a_policy_change_by_the_admin_api_is_followed_live_audited_and_in_its_history",
        ),
    ),
    Mutant(
        "admin-policy-who",
        "the policy's history names the admin key that made a change",
        "api/routes/admin_policy.py",
        "body.set, body.unset, model, who.name)",
        'body.set, body.unset, model, "admin")',
        (
            f"{ADMIN_TESTS}::test_a_policy_change_by_the_admin_api_is_followed_live_audited_and_in_its_history",
        ),
    ),
    Mutant(
        "admin-policy-validation",
        "a policy change is validated whole (the pool's and each model's policy) or refused",
        "llmq/policy/store.py",
        "        _check_all(pool, models)\n",
        "",
        (f"{ADMIN_TESTS}::test_a_bad_policy_value_is_refused_naming_the_key_changing_nothing",),
    ),
    Mutant(
        "admin-policy-param",
        "a refused policy change names the key (param) in OpenAI's error shape",
        "api/routes/admin_policy.py",
        "    return min(found)[1] if found else None",
        "    return None",
        (f"{ADMIN_TESTS}::test_a_bad_policy_value_is_refused_naming_the_key_changing_nothing",),
    ),
    Mutant(
        "console-policy-set",
        "the console's policy form changes the policy",
        "api/console/static/console.js",
        "changePolicy({ set: { [f.key.value]: typed(f.value.value.trim()) } })",
        "changePolicy({ set: {} })",
        (
            "tests/test_console.py::test_routing_and_a_guard_changed_from_the_console_and_a_bad_value_refused",
        ),
    ),
    Mutant(
        "console-policy-refusal",
        "the console's policy page shows a refused change",
        "api/console/static/console.js",
        '      $("policy-refused").hidden = false;',
        '      $("policy-refused").hidden = true;',
        (
            "tests/test_console.py::test_routing_and_a_guard_changed_from_the_console_and_a_bad_value_refused",
        ),
    ),
    Mutant(
        "console-tenant-hour",
        "the tenants page shows each tenant's throttled requests over the last hour",
        "api/console/static/console.js",
        'el("span", sum(h.rate_limited), { "data-hour-throttled": t.name })',
        'el("span", 0, { "data-hour-throttled": t.name })',
        ("tests/test_console.py::test_a_tenants_throttled_count_rises_under_a_flood",),
    ),
    Mutant(
        "console-tokens-bound",
        "a request's page keeps the latest tokens only, and counts the earlier ones",
        "api/console/static/console.js",
        "      if (over > 0) {",
        "      if (false) {",
        ("tests/test_console.py::test_the_live_views_are_bounded_a_long_request_and_a_long_queue",),
    ),
    Mutant(
        "worker-drain",
        "a drained worker finishes its runs and claims nothing more",
        "worker/main.py",
        "        if not worker.draining and await registry.drained(redis, worker_id):",
        "        if False:",
        (f"{ADMIN_TESTS}::test_a_drained_worker_finishes_its_runs_and_claims_nothing_more",),
    ),
    Mutant(
        "admission-budget-worker",
        "a worker claims only what fits its token budget (worker side)",
        "worker/queue_worker.py",
        "budget_left=self.token_budget - self.tokens_in_use if self.token_budget else None",
        "budget_left=None",
        ("tests/test_claim.py",),
    ),
    Mutant(
        "admission-budget-script",
        "the claim script skips a request over the budget left",
        "llmq/protocol/lua/claim.lua",
        "    if budget >= 0 and idle ~= '1' and tonumber(cost) > budget then\n      park(0)",
        "    if false then\n      park(0)",
        ("tests/test_claim.py",),
    ),
    Mutant(
        "batch-result-once",
        "a batch line's result is recorded once per custom_id, and counted once",
        "llmq/protocol/lua/batch_result.lua",
        "if redis.call('HEXISTS', output_key, custom_id) == 1\n"
        "    or redis.call('HEXISTS', errors_key, custom_id) == 1 then",
        "if false then",
        ("tests/test_batch.py",),
    ),
    Mutant(
        "batch-band",
        "batch lines wait in a band below every interactive priority",
        "llmq/protocol/queue.py",
        "return BATCH_BAND_MS + arrival_ms",
        "return arrival_ms",
        ("tests/test_batch.py",),
    ),
    Mutant(
        "batch-yield",
        "a batch line gives its slot to a live request and resumes later",
        "worker/queue_worker.py",
        "                await self._yield_to_live()\n",
        "",
        ("tests/test_batch.py",),
    ),
    Mutant(
        "batch-admission",
        "batch lines waiting do not count toward a model's queue bound",
        "llmq/protocol/lua/clock.lua",
        "  return redis.call('ZCOUNT', queue_key, '-inf', '(' .. BATCH_BAND_MS)",
        "  return redis.call('ZCARD', queue_key)",
        ("tests/test_batch.py",),
    ),
    Mutant(
        "batch-stopped-line",
        "a line stopped by its batch's cancel or expiry is an error line, not a partial answer",
        "api/batch/batch_feeder.py",
        "if status != 200 or await self._any_cancelled(subs):",
        "if status != 200:",
        ("tests/test_batch.py",),
    ),
    Mutant(
        "batch-sigterm-hand-over",
        "a SIGTERMed API process hands its batch feeding over: no line it collected fails",
        "api/main.py",
        "            await feeder.hand_over()\n",
        "            pass\n",
        (
            "tests/test_batch_faults.py::"
            "test_a_stopped_feeding_api_hands_its_batch_over_and_fails_no_line",
        ),
    ),
    Mutant(
        "batch-hand-over-lease",
        "a feeder that hands over gives its lease up, so another takes over at once",
        "api/batch/batch_feeder.py",
        "released = await batches.lease(self.redis, self.state.process_id, 0)",
        "released = False",
        (
            "tests/test_batch_faults.py::"
            "test_a_stopped_feeding_api_hands_its_batch_over_and_fails_no_line",
        ),
    ),
    Mutant(
        "batch-collect-owned",
        "a failed collection's exception is retrieved and logged once, never left unretrieved",
        "api/batch/batch_feeder.py",
        "task.add_done_callback(functools.partial(self._collect_ended, key))",
        "functools.partial(self._collect_ended, key)",
        (
            "tests/test_batch.py::"
            "test_a_collection_that_loses_redis_is_logged_once_and_leaves_no_task_exception",
        ),
    ),
    Mutant(
        "batch-ended-cleanup",
        "an ended batch keeps only itself and its files: its lines and results are deleted",
        "api/batch/batch_store.py",
        "            pipe.delete(key)",
        "            pipe.expire(key, ttl_seconds)",
        (
            "tests/test_batch.py::"
            "test_a_batch_runs_through_the_sdk_and_each_line_equals_the_request_alone",
        ),
    ),
    Mutant(
        "batch-ended-no-result",
        "an ended batch records no late result (which would bring its results back)",
        "llmq/protocol/lua/batch_result.lua",
        "if status == 'completed' or status == 'expired' or status == 'cancelled'\n"
        "    or status == 'failed' then",
        "if false then",
        (
            "tests/test_batch.py::"
            "test_a_batch_runs_through_the_sdk_and_each_line_equals_the_request_alone",
        ),
    ),
    Mutant(
        "batch-yield-no-failure",
        "a batch line's yields do not count against LLMQ_MAX_TRIES",
        "worker/queue_worker.py",
        'and attempt - await ctx["yields"](job.request_id) > runner.max_tries',
        "and attempt > runner.max_tries",
        ("tests/test_batch.py",),
    ),
    Mutant(
        "max-tries-runs",
        "a request fails after LLMQ_MAX_TRIES runs that were not yields",
        "worker/queue_worker.py",
        "        attempt > runner.max_tries\n        and",
        "        False\n        and",
        ("tests/test_batch.py",),
    ),
    Mutant(
        "relay-index-skip",
        "an OpenAI client sees every token exactly once (the relay skips sent indexes)",
        "api/streams/follow.py",
        "skip = self.next_index - event.index",
        "skip = 0",
        ("tests/test_exactly_once.py",),
    ),
    Mutant(
        "mid-stream-error",
        "a stream failing mid-way ends with an error chunk, then [DONE]",
        "api/routes/openai.py",
        'yield event_stream.data(error_body(message, "server_error", None, "stream_failed"))\n'
        "        yield event_stream.DONE",
        "raise",
        ("tests/test_stream_failure.py",),
    ),
    Mutant(
        "cancel-latency",
        "a cancelled running request stops within about one token interval",
        "worker/run.py",
        "or self.generation is None:\n            return False\n        self._stop_model()",
        "or self.generation is None:\n            return False\n"
        "        asyncio.get_running_loop().call_later(0.1, self._stop_model)",
        ("tests/test_cancel_latency.py",),
    ),
    Mutant(
        "client-closed-499",
        "a non-streaming client that disconnects is answered 499 and its request cancelled",
        "api/routes/openai.py",
        "release_later(state, sub.model, sub.id, cancel=not finished)",
        "release_later(state, sub.model, sub.id, cancel=False)",
        ("tests/test_cancel_latency.py",),
    ),
    Mutant(
        "hand-back-score",
        "a stopping worker hands requests back at their original score",
        "llmq/protocol/lua/requeue.lua",
        "redis.call('ZADD', queue_key, score, id)",
        "redis.call('ZADD', queue_key, score + 60000, id)",
        ("tests/test_handback.py",),
    ),
    Mutant(
        "overload-bound",
        "a model's queue holds at most LLMQ_MAX_QUEUE_DEPTH requests",
        "api/admission/submit.py",
        "admit(calls, depth, quota=take)",
        "admit(calls, depth + 2, quota=take)",
        ("tests/test_overload.py",),
    ),
    Mutant(
        "overload-429-fast",
        "a refused request gets its 429 within milliseconds",
        "api/admission/submit.py",
        "    if not answer.queued:\n",
        "    if not answer.queued:\n        time.sleep(0.1)\n",
        ("tests/test_overload.py",),
    ),
    Mutant(
        "loadgen-dropped",
        "the load generator tells a refused connection from one dropped mid-stream",
        "loadgen/client.py",
        'kind: FailureKind = "dropped" if started else "connection"',
        'kind: FailureKind = "connection"',
        (
            "tests/test_loadgen_llmq.py::test_a_connection_dropped_mid_stream_is_a_drop",
            "tests/test_loadgen_client.py::test_failures_are_classified",
        ),
    ),
    Mutant(
        "priority-order",
        "a lower priority number runs earlier (effective-time score)",
        "llmq/protocol/queue.py",
        "return max(1, arrival_ms + priority * step_ms)",
        "return max(1, arrival_ms)",
        ("tests/test_scheduling.py::test_higher_priority_overtakes_a_backlog",),
    ),
    Mutant(
        "queue-deadline",
        "a request still queued at its deadline never starts",
        "llmq/protocol/lua/claim.lua",
        "    into = cancelled\n  elseif deadline and tonumber(deadline) <= deadline_now then",
        "    into = cancelled\n  elseif false then",
        ("tests/test_claim.py::test_the_claim_drops_a_request_past_its_queue_deadline",),
    ),
    Mutant(
        "cancel-queued",
        "a cancelled queued request is removed at once and never runs",
        "llmq/protocol/lua/cancel.lua",
        "if redis.call('ZREM', queue_key, id) == 1 then",
        "if false then",
        ("tests/test_cancellation.py::test_delete_running_and_queued",),
    ),
    Mutant(
        "lease-reap",
        "a dead worker's requests are requeued once their lease expires",
        "llmq/protocol/lua/reap.lua",
        "  if expiry and expiry <= now and attempt == fenced then\n",
        "  if false then\n",
        ("tests/test_faults.py::test_reaper_requeues_a_dead_workers_requests",),
    ),
    Mutant(
        "body-limit",
        "a body over LLMQ_MAX_BODY_BYTES gets 413, with or without Content-Length",
        "api/admission/limits.py",
        "            if size > limit:",
        "            if False:",
        ("tests/test_validation.py::test_oversized_body",),
    ),
    Mutant(
        "auth",
        "with API keys on, a request without a valid key gets 401",
        "api/admission/auth.py",
        "    if matched:\n        name: str | None = state.tenancy.default()",
        "    if True:\n        name: str | None = state.tenancy.default()",
        ("tests/test_auth.py::test_keys_are_required",),
    ),
    Mutant(
        "stop-sequence",
        "`stop` ends the text before the stop sequence, finish_reason stop",
        "worker/mock.py",
        "return None if any(s in token for s in request.stop) else token",
        "return token",
        (f"{CONTRACT}::test_a_stop_sequence_ends_the_text_before_it_with_finish_reason_stop",),
    ),
    Mutant(
        "stop-probability",
        "LLMQ_MODEL_STOP_PROBABILITY ends generations early with stop",
        "worker/mock.py",
        "if not self.stop_probability or rng.random() >= self.stop_probability:",
        "if True:",
        (f"{CONTRACT}::test_the_stop_probability_ends_generations_early_with_stop",),
    ),
    Mutant(
        "default-max-tokens",
        "LLMQ_DEFAULT_MAX_TOKENS applies to a request without max_tokens",
        "api/admission/submit.py",
        "return min(tokens, cap) if cap else tokens",
        "return tokens",
        (f"{CONTRACT}::test_default_max_tokens_applies_when_a_request_sets_none",),
    ),
    Mutant(
        "unset-max-tokens-context",
        "a request without max_tokens gets what the model's context leaves",
        "api/admission/submit.py",
        "tokens = limit if room is None else max(1, room)",
        "tokens = limit",
        (
            f"{CONTRACT}::test_a_request_without_max_tokens_gets_what_the_context_leaves",
            "tests/test_upstream.py::test_a_request_without_max_tokens_runs_to_the_end_of_the_context",
        ),
    ),
    Mutant(
        "sse-keepalive",
        "an idle SSE stream gets a comment every LLMQ_SSE_KEEPALIVE_SECONDS",
        "api/streams/follow.py",
        "keepalive = state.settings.sse_keepalive_seconds",
        "keepalive = 15.0",
        (f"{CONTRACT}::test_an_idle_stream_gets_a_keepalive_comment_at_the_set_interval",),
    ),
    Mutant(
        "last-event-id-query",
        "`?last_event_id=` resumes a native stream like the Last-Event-ID header",
        "api/routes/native.py",
        'resume = last_event_id or last_event_id_query or "0-0"',
        'resume = last_event_id or "0-0"',
        (f"{CONTRACT}::test_events_url_run_ms_and_last_event_id_in_the_query",),
    ),
    Mutant(
        "context-length",
        "a prompt over LLMQ_MAX_PROMPT_TOKENS gets 400 context_length_exceeded",
        "api/admission/submit.py",
        "    if prompt_tokens > limit:\n",
        "    if False:\n",
        (f"{CONTRACT}::test_context_length_exceeded_and_model_not_found",),
    ),
    Mutant(
        "model-error-500",
        "a non-streaming model error is answered 500 model_error",
        "api/routes/openai.py",
        'return 504 if event.finish_reason == "timeout" else 500',
        'return 504 if event.finish_reason == "timeout" else 502',
        (f"{CONTRACT}::test_a_non_streaming_model_error_is_a_500_with_model_error",),
    ),
    Mutant(
        "openai-disconnect-cancel",
        "a streaming client that disconnects cancels its request",
        "api/routes/openai.py",
        "release_later(state, c.sub.model, c.sub.id, cancel=not c.finished)",
        "release_later(state, c.sub.model, c.sub.id, cancel=False)",
        (
            "tests/test_cancellation.py"
            "::test_disconnect_mid_stream_stops_generation_and_frees_the_slot",
        ),
    ),
    Mutant(
        "generation-timeout",
        "a running request stops at its generation timeout (finish_reason timeout, 504)",
        "worker/runner.py",
        "async with asyncio.timeout_at(deadline):",
        "async with asyncio.timeout(None):",
        ("tests/test_admission.py::test_generation_timeout",),
    ),
    Mutant(
        "timeout-504",
        "a non-streaming request that timed out is answered 504",
        "api/routes/openai.py",
        'return 504 if event.finish_reason == "timeout" else 500',
        "return 500",
        ("tests/test_admission.py::test_generation_timeout",),
    ),
    Mutant(
        "retry-after",
        "a 429 carries Retry-After: 1",
        "api/errors.py",
        '        out.setdefault("Retry-After", "1")\n',
        '        out.pop("Retry-After", None)\n',
        ("tests/test_admission.py::test_full_queue_gets_429_and_enqueues_nothing",),
    ),
    Mutant(
        "other-key-404",
        "a request's status, events and cancel answer 404 to every other key",
        "api/routes/native.py",
        "    if owner is not None and record.owner != owner:",
        "    if False:",
        ("tests/test_auth.py::test_a_request_is_visible_only_to_its_key",),
    ),
    Mutant(
        "resume-after-published",
        "a re-run resumes after the tokens already in the stream",
        "worker/runner.py",
        "generated = await published_tokens(redis, rid)",
        "generated = []",
        (
            "tests/test_resume.py"
            "::test_rerun_after_a_model_error_resumes_after_the_published_tokens",
        ),
    ),
    Mutant(
        "compose-aof",
        "compose runs Redis with AOF, so queued requests survive a restart",
        "docker-compose.yml",
        '"--appendonly", "yes"',
        '"--appendonly", "no"',
        ("tests/test_compose.py",),
    ),
    Mutant(
        "compose-stop-grace",
        "compose gives workers a stop grace longer than their drain window",
        "docker-compose.yml",
        "stop_grace_period: 30s",
        "stop_grace_period: 10s",
        ("tests/test_compose.py",),
    ),
    Mutant(
        "alert-burn-6x",
        "a 6x burn of an objective's error budget over 6h and 30m pages",
        ALERT_RULES,
        "llmq:slo_errors:ratio_rate6h > on (slo) group_left () (6 * llmq:slo:error_budget)",
        "llmq:slo_errors:ratio_rate6h > on (slo) group_left () (60 * llmq:slo:error_budget)",
        (ALERT_TESTS,),
    ),
    Mutant(
        "alert-burn-short-window",
        "a burn that stopped pages no more (each row's short window must burn too)",
        ALERT_RULES,
        "llmq:slo_errors:ratio_rate30m > on (slo) group_left ()",
        "llmq:slo_errors:ratio_rate6h > on (slo) group_left ()",
        (ALERT_TESTS,),
    ),
    Mutant(
        "alert-5xx-ratio",
        "a 5xx ratio over 5% of the API's responses pages",
        ALERT_RULES,
        'sum(rate(llmq_http_responses_total{code_class="5xx"}[5m]))',
        'sum(rate(llmq_http_responses_total{code_class="4xx"}[5m]))',
        (ALERT_TESTS,),
    ),
    Mutant(
        "http-responses-once",
        "each HTTP response is counted once, by its status class, at its start",
        "api/app.py",
        'if message["type"] == "http.response.start":\n            code_class',
        'if message["type"].startswith("http.response"):\n            code_class',
        ("tests/test_metrics.py::test_http_responses_are_counted_by_status_class_once_each",),
    ),
    Mutant(
        "alert-no-live-worker",
        "a model without a live worker pages, unless its autoscaler wants none",
        ALERT_RULES,
        "max by (model) (llmq_live_workers) == 0",
        "max by (model) (llmq_live_workers) < 0",
        (ALERT_TESTS,),
    ),
    Mutant(
        "job-timeout-bound",
        "the generation stops before the job timeout and ends the request itself",
        "worker/runner.py",
        "if progress.deadline is not None and progress.deadline < deadline:",
        "if False:",
        (f"{CONTRACT}::test_the_job_timeout_ends_a_request_that_runs_longer",),
    ),
    Mutant(
        "job-timeout-backstop",
        "a run arq's job timeout cancelled still ends with a timeout error",
        "worker/queue_worker.py",
        "            await self.runner.end_unfinished(job_id)\n",
        "            pass\n",
        (f"{CONTRACT}::test_arqs_job_timeout_ends_a_run_that_did_not_stop_itself",),
    ),
    Mutant(
        "lease-clock-cap",
        "a Redis stall longer than a lease reaps nobody (the lease clock is capped)",
        "llmq/protocol/lua/clock.lua",
        "lease = lease + math.min(math.max(real - last, 0), CLOCK_CAP_MS)",
        "lease = lease + math.max(real - last, 0)",
        (
            "tests/test_scripts.py::test_the_lease_clock_follows_real_time_but_skips_a_gap",
            "tests/test_redis_faults.py::test_a_redis_stall_longer_than_a_lease_reaps_nobody",
        ),
    ),
    Mutant(
        "publish-fence",
        "a worker that lost its lease writes nothing more (the publish script's fence)",
        "llmq/protocol/lua/publish.lua",
        "if attempt > 0 and attempt < fence then",
        "if false then",
        (
            "tests/test_scripts.py::test_a_fenced_write_is_refused_and_lands_nowhere",
            "tests/test_redis_faults.py"
            "::test_a_fenced_worker_stops_and_writes_nothing_after_losing_its_lease",
        ),
    ),
    Mutant(
        "publisher-retry",
        "writes that fail while Redis is away are kept, in order, and retried",
        "worker/publisher.py",
        "            self._pending = batch\n            raise\n",
        "            raise\n",
        (
            "tests/test_publisher.py"
            "::test_writes_that_cannot_land_are_kept_in_order_and_logged_once",
        ),
    ),
    Mutant(
        "renew-cancel-flag",
        "a worker that missed a cancel message finds the flag at its next lease renewal",
        "llmq/protocol/lua/renew.lua",
        "if redis.call('EXISTS', cancel_prefix .. id) == 1 then",
        "if false then",
        (
            "tests/test_redis_faults.py"
            "::test_a_cancel_sent_while_the_worker_is_not_subscribed_still_stops_it",
        ),
    ),
    Mutant(
        "batch-all-or-none",
        "a request's choices are admitted all or none",
        "llmq/protocol/lua/enqueue_batch.lua",
        "if live_depth(queue_key) + n > max_depth then",
        "if live_depth(queue_key) + 1 > max_depth then",
        ("tests/test_choices.py::test_choices_are_admitted_all_or_none",),
    ),
    Mutant(
        "x-should-retry",
        "every error says in x-should-retry whether a retry can help",
        "api/errors.py",
        'out["x-should-retry"] = "true" if retry else "false"',
        'out["x-should-retry"] = "true"',
        ("tests/test_contract.py::test_every_error_says_whether_to_retry",),
    ),
    Mutant(
        "abort-finish-reason",
        "a cancelled or timed-out choice ends with finish_reason abort (llmq's own reason aside)",
        "api/openai_format.py",
        'return {"finish_reason": "abort", LLMQ_FINISH_REASON: reason}',
        'return {"finish_reason": reason}',
        ("tests/test_contract.py::test_cancelled_and_timed_out_choices_end_with_abort",),
    ),
    Mutant(
        "strict-types",
        'request fields are type-checked strictly (true is no integer, "yes" no boolean)',
        "api/bodies.py",
        'model_config = ConfigDict(extra="ignore", strict=True)',
        'model_config = ConfigDict(extra="ignore", strict=False)',
        ("tests/test_validation.py::test_bad_completion_requests",),
    ),
    Mutant(
        "enqueue-replicas",
        "with LLMQ_ENQUEUE_MIN_REPLICAS, an enqueue no replica holds is refused",
        "llmq/replication.py",
        "return int(acked) >= replicas",
        "return True",
        (
            "tests/test_replication.py"
            "::test_an_enqueue_no_replica_acknowledges_is_refused_and_cancelled",
        ),
    ),
    Mutant(
        "supervisor-restart",
        "a supervised child that dies unasked is restarted, with a log line naming it",
        "cli/supervisor.py",
        "if not await self._restart(child, process.pid, code):",
        "if True:",
        ("tests/test_supervisor.py::test_a_killed_child_is_restarted_with_a_log_line",),
    ),
    Mutant(
        "supervisor-crash-loop",
        "a child restarted too often within the window stops the stack with a clear error",
        "cli/supervisor.py",
        "if recent >= policy.limit:",
        "if False:",
        ("tests/test_supervisor.py::test_a_crash_loop_fails_with_a_clear_message",),
    ),
    Mutant(
        "autoscaler-lease-exclusive",
        "only one autoscaler holds the leader lease at a time",
        "llmq/autoscale/lease.py",
        "if redis.call('SET', lease_key, owner, 'NX', 'PX', ttl_ms) then",
        "if redis.call('SET', lease_key, owner, 'PX', ttl_ms) then",
        ("tests/test_autoscale_controller.py::test_two_controllers_never_both_act",),
    ),
    Mutant(
        "autoscaler-lease-valid",
        "an autoscaler stalled past its lease does not act (it checks the lease before acting)",
        "llmq/autoscale/controller.py",
        "if not self.lease.valid():",
        "if False:",
        ("tests/test_autoscale_controller.py::test_two_controllers_never_both_act",),
    ),
    Mutant(
        "scale-down-window",
        "scale-down waits for the stabilization window (the highest desire within it)",
        "llmq/autoscale/law.py",
        "stable = max(d for _, d in self._history)",
        "stable = desired",
        (
            "tests/test_autoscale_law.py"
            "::test_scale_down_waits_for_the_window_and_goes_one_step_at_a_time",
        ),
    ),
    Mutant(
        "autoscale-burst-filter",
        "a queue the live workers serve within the wait budget orders no worker",
        "llmq/autoscale/law.py",
        "if settings.project_backlog and settings.burst_filter:",
        "if False:",
        ("tests/test_autoscale_law.py::test_a_burst_the_queue_absorbs_orders_nothing",),
    ),
    Mutant(
        "autoscale-fifo-drain",
        "a backlog's order is sized for its last request within the budget, served in order",
        "llmq/autoscale/law.py",
        "if settings.fifo_drain:",
        "if False:",
        ("tests/test_autoscale_law.py::test_the_backlog_order_serves_the_queue_in_order",),
    ),
    Mutant(
        "autoscale-window-cut",
        "a drop beyond doubt (queue empty, recent arrivals need half or fewer) ends the window",
        "llmq/autoscale/law.py",
        "if cfg.window_cut and s.queued == 0",
        "if False and s.queued == 0",
        ("tests/test_autoscale_law.py::test_a_drop_ends_the_scale_down_window",),
    ),
    Mutant(
        "pool-exhausted-429",
        "an exhausted Redis pool is answered 429 server_busy, not 503",
        "api/errors.py",
        "    app.add_exception_handler(PoolExhausted, _pool_exhausted)\n",
        "",
        ("tests/test_pool.py::test_exhausted_pool_answers_429_not_503",),
    ),
    Mutant(
        "pool-stale-reply",
        "a pool hands out no connection holding an unread reply, though its check reads nothing",
        "llmq/connection.py",
        "        return bool(reader.has_data() or stream.at_eof() or received)\n",
        "        return False\n",
        (
            "tests/test_pool.py::"
            "test_a_connection_returned_with_an_unread_reply_is_not_handed_out_as_is",
        ),
    ),
    Mutant(
        "handoff-stale-heartbeat",
        "the hand-off skips a parked worker whose heartbeat is older than its lease",
        "llmq/protocol/lua/enqueue.lua",
        "if not free or now - beat > tonumber(lease)\n",
        "if not free\n",
        (
            "tests/test_handoff.py"
            "::test_a_parked_worker_whose_heartbeat_is_older_than_its_lease_is_skipped",
        ),
    ),
    Mutant(
        "api-process-restart",
        "a dead API process of llmq api --api-processes N is restarted",
        "cli/api_processes.py",
        "children.append(await supervisor.start(name, argv, env))",
        "children.append(await supervisor.start(name, argv, env, restart=False))",
        ("tests/test_api_processes.py::test_a_killed_process_is_restarted_and_the_others_go_on",),
    ),
    Mutant(
        "api-processes-under-run",
        "llmq run --api-processes N supervises the N API processes itself",
        "cli/stack.py",
        "api_commands(settings.api_processes)",
        "api_commands(1)",
        ("tests/e2e/test_run_supervised.py::test_api_processes_run_as_children_of_the_stack",),
    ),
    Mutant(
        "orphans-limit",
        "the orphan sweep takes at most its limit per call",
        "llmq/protocol/lua/orphans.lua",
        "for _, m in ipairs(redis.call('SPOP', key, left)) do",
        "for _, m in ipairs(redis.call('SPOP', key, limit)) do",
        (
            "tests/test_scripts.py::test_orphans_takes_at_most_the_limit_and_forgets_a_dead_process_once_empty",
        ),
    ),
    Mutant(
        "orphans-keep-until-empty",
        "a dead API process is forgotten only once nothing is attached to it",
        "llmq/protocol/lua/orphans.lua",
        "  if redis.call('SCARD', key) == 0 then\n",
        "  if true then\n",
        (
            "tests/test_scripts.py::test_orphans_takes_at_most_the_limit_and_forgets_a_dead_process_once_empty",
        ),
    ),
    Mutant(
        "worker-beat-drop-info",
        "a dead worker's registry entry is dropped with its info key",
        "llmq/protocol/lua/worker_beat.lua",
        "  redis.call('DEL', info_prefix .. dead)\n",
        "",
        (
            "tests/test_scripts.py::test_worker_beat_scores_by_lease_time_and_drops_the_dead_with_their_info",
        ),
    ),
    Mutant(
        "worker-beat-lease-time",
        "worker entries are judged by lease time, the clock live_workers reads",
        "llmq/protocol/lua/worker_beat.lua",
        "local now = lease_now(clock_key)",
        "local t = redis.call('TIME')\n"
        "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)",
        (
            "tests/test_scripts.py::test_worker_beat_scores_by_lease_time_and_drops_the_dead_with_their_info",
        ),
    ),
    Mutant(
        "enqueue-queue-full",
        "a full queue refuses a request (queue_full) and keeps nothing of it",
        "llmq/protocol/lua/enqueue.lua",
        "if live_depth(queue_key) >= max_depth then",
        "if live_depth(queue_key) > max_depth then",
        ("tests/test_scripts.py::test_enqueue_refuses_a_full_queue_and_leaves_no_trace",),
    ),
    Mutant(
        "claim-drops-cancelled",
        "a request cancelled while queued is dropped by the claim, never run",
        "llmq/protocol/lua/claim.lua",
        "  if redis.call('EXISTS', cancel_prefix .. id) == 1 then\n    into = cancelled",
        "  if false then\n    into = cancelled",
        ("tests/test_scripts.py::test_a_claim_drops_and_reports_a_cancelled_request_on_its_way",),
    ),
    Mutant(
        "cancel-flag",
        "a cancel of a request not queued sets the flag its worker finds",
        "llmq/protocol/lua/cancel.lua",
        "redis.call('SET', flag_key, '1', 'PX', flag_ttl_ms)\n",
        "",
        ("tests/test_scripts.py::test_cancel_removes_a_queued_request_and_flags_any_other",),
    ),
    Mutant(
        "sweep-only-queued",
        "the deadline sweep reports only requests it took from the queue",
        "llmq/protocol/lua/sweep.lua",
        "  if redis.call('ZREM', queue_key, id) == 1 then\n",
        "  redis.call('ZREM', queue_key, id)\n  if true then\n",
        (
            "tests/test_scripts.py::test_sweep_expires_only_queued_requests_past_their_deadline_up_to_the_limit",
        ),
    ),
    Mutant(
        "reap-attempt",
        "a reap requeues only the attempt whose fence it raised",
        "llmq/protocol/lua/reap.lua",
        "  if expiry and expiry <= now and attempt == fenced then\n",
        "  if expiry and expiry <= now then\n",
        ("tests/test_scripts.py::test_reap_requeues_only_a_due_lease_of_the_fenced_attempt",),
    ),
    Mutant(
        "shutdown-ends-streams",
        "at shutdown the API ends every open stream with an error chunk, then [DONE]",
        "api/main.py",
        "if state is not None and (n := end_open_streams(state)):",
        "if False and state is not None and (n := end_open_streams(state)):",
        (
            "tests/e2e/test_run_supervised.py"
            "::test_ctrl_c_stops_in_order_and_ends_every_stream_cleanly",
        ),
    ),
    Mutant(
        "mean-tokens",
        "the mock's answers stop by themselves at LLMQ_MODEL_MEAN_TOKENS on average",
        "llmq/settings.py",
        "return 1.0 / self.model_mean_tokens",
        "return 0.0",
        ("tests/test_mock_defaults.py::test_answers_stop_at_the_mean_length_and_repeat_per_seed",),
    ),
    Mutant(
        "tool-result-answered",
        "tool_choice auto answers a tool's result in text, so agent loops end",
        "worker/mock.py",
        "or (not request.after_tool_result and rng.random() < 0.5)",
        "or rng.random() < 0.5",
        ("tests/test_structured_clients.py::test_an_agent_loop_ends_after_the_tool_result",),
    ),
    Mutant(
        "json-mode-prompt-schema",
        "JSON mode follows a JSON Schema written in the prompt",
        "worker/structured.py",
        "            found = value\n",
        "            pass\n",
        ("tests/test_structured_clients.py::test_json_mode_follows_a_schema_in_the_prompt",),
    ),
    Mutant(
        "schema-refs",
        "structured output follows $ref (Pydantic's nested models) instead of refusing it",
        "llmq/model/json_refs.py",
        '            target = self.effective(self.target(schema["$ref"]), hops + 1)\n',
        '            raise SchemaError("$ref is not supported")\n',
        ("tests/test_structured_clients.py::test_openai_parse_fills_pydantic_models",),
    ),
    Mutant(
        "resume-after-end",
        "a native resume at or past the final event ends at once",
        "api/streams/follow.py",
        'if last_id != "0-0" and await _ended_by(state, request_id, last_id):',
        "if False:",
        ("tests/test_resume_after_end.py",),
    ),
    Mutant(
        "upstream-resume",
        "a re-run on an inference server continues the published text, not the prompt",
        "worker/backends/openai.py",
        'prompt = request.prompt + "".join(resumed)',
        "prompt = request.prompt",
        (
            "tests/test_upstream.py::test_a_killed_worker_resumes_on_the_other_and_the_text_is_unbroken",
        ),
    ),
    Mutant(
        "upstream-token-ids",
        "a vLLM worker counts the tokens each chunk lists, not its chunks",
        "worker/backends/engines.py",
        """        if self.lists_token_ids:
            body["return_token_ids"] = True""",
        """        pass""",
        (
            "tests/test_upstream_vllm.py::test_tokens_through_llmq_equal_vllm_directly_counted_by_its_token_ids",
        ),
    ),
    Mutant(
        "upstream-stale-connection",
        "a request the upstream hung up on unanswered goes again on a new connection",
        "worker/backends/openai.py",
        "                if not unsent(exc):",
        "                if True:",
        (
            "tests/test_upstream_connections.py::test_a_request_the_server_hung_up_on_unanswered_goes_again",
        ),
    ),
    Mutant(
        "upstream-replay-diverged",
        "a replay that writes other tokens than those published fails, never splices",
        "worker/backends/openai.py",
        "elif str(out) != published[seen]:",
        "elif False:",
        (
            "tests/test_upstream_replay.py::test_a_replay_that_writes_another_call_fails_the_request_never_splices",
        ),
    ),
    Mutant(
        "upstream-replay-published",
        "a replay passes on only what follows the published tokens",
        "worker/backends/openai.py",
        "outputs = _after_published(outputs, request.generated)",
        "pass",
        (
            "tests/test_upstream_replay.py::test_a_replay_that_writes_the_same_call_completes_it_once",
        ),
    ),
    Mutant(
        "upstream-hand-back",
        "a worker whose inference server stops answering hands its requests back",
        "worker/backends/watch.py",
        "self.worker.runner.hand_back(request_id)",
        "pass",
        ("tests/test_upstream.py::test_a_hung_server_hands_its_request_to_the_other_worker",),
    ),
    Mutant(
        "upstream-unready",
        "/v1/workers and /readyz show a worker whose inference server is down",
        "worker/main.py",
        "ready=watch is None or watch.ready,",
        "ready=True,",
        (
            "tests/test_upstream.py::test_a_killed_server_hands_its_request_to_the_other_workers_server",
        ),
    ),
    Mutant(
        "upstream-identified",
        "a worker finds which engine serves its upstream, and takes its slots and context",
        "worker/backends/openai.py",
        'self.engine = await identify(self._get_json) or ENGINES["generic"]',
        'self.engine = ENGINES["generic"]',
        (
            "tests/test_upstream_engines.py",
            "tests/test_upstream.py::test_tokens_through_llmq_equal_the_server_directly",
        ),
    ),
    Mutant(
        "upstream-chat-default",
        "chat requests reach the model's own chat template by default",
        "worker/backends/openai.py",
        "self.chat = renders is not False",
        "self.chat = False",
        (
            "tests/test_upstream.py::test_chat_through_llmq_equals_the_servers_own_chat_given_only_its_url",
        ),
    ),
    Mutant(
        "upstream-engine-tokens",
        "a llama.cpp worker counts the engine's tokens (timings.predicted_n), not its chunks",
        "worker/backends/engines.py",
        """        # ``timings.predicted_n`` counts them
        body["timings_per_token"] = True""",
        """        pass""",
        (
            "tests/test_upstream.py::test_usage_and_max_tokens_count_the_servers_tokens_not_its_chunks",
            "tests/test_upstream.py::test_a_killed_worker_resumes_on_the_other_and_the_text_is_unbroken",
        ),
    ),
    Mutant(
        "trace-traceparent-continued",
        "the API continues the client's W3C traceparent (its trace id, its span as parent)",
        "api/traced.py",
        "context=tracing.extract(carried),",
        "context=None,",
        ("tests/test_tracing.py::test_one_request_is_one_trace_from_the_client_to_the_engine",),
    ),
    Mutant(
        "trace-context-in-job",
        "the request's trace context rides in the job: the worker's spans join the API's trace",
        "api/admission/submit.py",
        "        trace=trace,\n",
        "",
        ("tests/test_tracing.py::test_one_request_is_one_trace_from_the_client_to_the_engine",),
    ),
    Mutant(
        "trace-upstream-header",
        "the OpenAI backend sends traceparent to the engine, its llmq.engine span as parent",
        "worker/backends/openai.py",
        "await self._post(path, body, tracing.inject(engine))",
        "await self._post(path, body)",
        ("tests/test_tracing.py::test_the_engine_receives_the_trace_context_of_its_call",),
    ),
    Mutant(
        "refused-is-4xx",
        "a request the model refuses (its own fault) gets 400 invalid_request_error, not 500",
        "api/routes/openai.py",
        """    if event.refused or event.code == "unsupported_parameter":
        return 400""",
        """    if event.code == "unsupported_parameter":
        return 400""",
        (
            "tests/test_upstream.py::test_a_prompt_the_server_refuses_is_the_clients_error_streamed_or_not",
        ),
    ),
    Mutant(
        "declared-tokenizer",
        "the API counts a prompt with the tokenizer its workers declare",
        "api/admission/submit.py",
        "prompt_tokens = declared.tokenizer.count(prompt)",
        "prompt_tokens = len(prompt.split())",
        ("tests/test_declaration.py",),
    ),
    Mutant(
        "quota-all-or-none",
        "a tenant's tokens per minute hold across API processes (one atomic take)",
        "llmq/protocol/lua/quota_take.lua",
        "elseif tpm > 0 and tok_level <= 0 then",
        "elseif false then",
        (
            "tests/test_quota.py::test_a_take_is_all_or_none_and_a_return_counts_once",
            "tests/test_quota.py::test_unused_tokens_come_back_when_a_request_ends",
        ),
    ),
    Mutant(
        "quota-held",
        "a request whose quota take was refused is not queued, in the take's round trip",
        "llmq/protocol/lua/enqueue.lua",
        "if quota_held ~= '' and redis.call('HEXISTS', quota_held, id) == 0 then",
        "if false then",
        ("tests/test_quota.py::test_a_request_is_queued_only_with_its_quota_taken",),
    ),
    Mutant(
        "rolling-restart-quota",
        "after a rolling restart under load no tenant holds a place among its requests at once",
        "llmq/protocol/lua/quota_return.lua",
        "redis.call('ZREM', inflight_key, id)",
        "-- the place is kept",
        ("tests/test_rolling_restart.py",),
    ),
    Mutant(
        "rolling-restart-tenant-tokens",
        "each tenant's tokens counted (llmq tenant stats) equal its requests' records",
        "llmq/protocol/queue.py",
        "self.tally.inc(metrics.TENANT_TOKENS, label, amount=used)",
        "self.tally.inc(metrics.TENANT_TOKENS, label, amount=used + 1)",
        ("tests/test_rolling_restart.py",),
    ),
    Mutant(
        "stale-finish-changes-nothing",
        "a finish by an attempt that lost its lease deletes no job and counts no tokens",
        "llmq/protocol/queue.py",
        "            if not replies[0]:\n                return",
        "            pass",
        ("tests/test_scripts.py::test_a_finish_by_an_attempt_that_lost_its_lease_changes_nothing",),
    ),
    Mutant(
        "rerun-of-ended-writes-nothing",
        "a re-run of a request an earlier attempt ended writes no second start or end",
        "worker/runner.py",
        "            ended = await final_event_id(redis, rid) is not None",
        "            ended = False",
        ("tests/test_resume.py::test_a_rerun_of_a_request_that_ended_writes_nothing",),
    ),
    Mutant(
        "fair-routed-window-least-first",
        "under routing, the least-served tenant's request comes first where affinity prefers none",
        "llmq/protocol/lua/fair.lua",
        "    if a[2] ~= b[2] then return a[2] < b[2] end\n"
        "    return tonumber(a[4]) < tonumber(b[4])",
        "    return tonumber(a[4]) < tonumber(b[4])",
        (
            "tests/test_fairness.py::test_under_routing_affinity_chooses_within_the_slack",
            "tests/test_fairness.py::test_through_the_api_a_light_tenant_overtakes_a_noisy_backlog",
        ),
    ),
    Mutant(
        "chaos-batch-line-kill",
        "the chaos checker allows a batch line's count lost with a process killed just after",
        "bench/chaos/checker.py",
        "if _ended_before_kill(history, run.finished.get(request_id))",
        "if False",
        (
            "tests/test_chaos_checker.py::"
            "test_a_batch_lines_tokens_lost_with_a_killed_process_are_allowed_only_then",
        ),
    ),
    Mutant(
        "claim-matched-blocks",
        "a routed claim says how many leading blocks the claimer held (the session bonus apart)",
        "llmq/protocol/lua/claim.lua",
        "matched = want > #hint.blocks and want - #hint.blocks - 1 or want",
        "matched = want",
        (
            "tests/test_routing_scripts.py::"
            "test_a_claim_says_how_many_leading_blocks_the_claimer_held",
        ),
    ),
    Mutant(
        "trace-policy-version",
        "a queue wait names the pool policy version its claim was made under",
        "worker/queue_worker.py",
        '                ("llmq.policy.version", claim.policy_version),\n',
        "",
        (
            "tests/test_tracing.py::"
            "test_a_queue_wait_carries_the_policy_version_and_values_it_was_claimed_under",
        ),
    ),
    Mutant(
        "trace-live-policy",
        "a run's spans carry the live policy's routing and fairness, not the start's",
        "worker/main.py",
        "        trace_attributes=lambda: {\n"
        '            "llmq.routing": policy.of(settings.model).routing,\n'
        '            "llmq.fairness": policy.of(settings.model).fairness,\n'
        "        },\n",
        "        trace_attributes=(lambda d: lambda: d)({\n"
        '            "llmq.routing": policy.of(settings.model).routing,\n'
        '            "llmq.fairness": policy.of(settings.model).fairness,\n'
        "        }),\n",
        (
            "tests/test_tracing.py::"
            "test_a_queue_wait_carries_the_policy_version_and_values_it_was_claimed_under",
        ),
    ),
    Mutant(
        "trace-batch-line-admission",
        "a batch line's admission is a span of its line's trace, under llmq.batch_line",
        "api/admission/submit.py",
        "parent = tracing.extract(trace) if band is not None and trace else None",
        "parent = None",
        (
            "tests/test_tracing.py::"
            "test_a_batch_lines_trace_is_rooted_in_its_line_through_the_worker",
        ),
    ),
    Mutant(
        "trace-one-server-span",
        "a request's trace has one server span, llmq.request (FastAPI's own is off)",
        "api/app.py",
        '    {"telemetry": {"tracing": False}}\n',
        "    {}\n",
        ("tests/test_tracing.py::test_one_request_is_one_trace_from_the_client_to_the_engine",),
    ),
    Mutant(
        "trace-claim-matched-blocks",
        "a routed claim's matched prefix blocks are on the attempt's llmq.queue_wait span",
        "worker/queue_worker.py",
        '                ("llmq.claim.matched_blocks", claim.matched_blocks),\n',
        "",
        ("tests/test_tracing.py::test_a_routed_claims_matched_blocks_are_on_its_queue_wait",),
    ),
    Mutant(
        "trace-claim-overtook",
        "a traced claim says how many requests queued ahead the claimed one went before",
        "llmq/protocol/lua/claim.lua",
        "overtook = redis.call('ZCOUNT', queue_key, '-inf', '(' .. score)",
        "overtook = 0",
        (
            "tests/test_routing_scripts.py:"
            ":test_a_traced_claim_says_what_it_overtook_how_long_it_was_held_and_what_let_it_go",
            "tests/test_tracing.py::test_a_routed_claims_matched_blocks_are_on_its_queue_wait",
        ),
    ),
    Mutant(
        "trace-claim-held",
        "a traced claim says how long the request was left to a busy prefix holder",
        "llmq/protocol/lua/claim.lua",
        "held_ms = math.max(deadline_now - tonumber(held_since[i]), 0)",
        "held_ms = -1",
        (
            "tests/test_routing_scripts.py:"
            ":test_a_traced_claim_says_what_it_overtook_how_long_it_was_held_and_what_let_it_go",
        ),
    ),
    Mutant(
        "trace-claim-released-by",
        "a traced claim names the guard that made the request anyone's",
        "llmq/protocol/lua/claim.lua",
        "    released_by = why\n",
        "    released_by = ''\n",
        (
            "tests/test_routing_scripts.py:"
            ":test_a_traced_claim_says_what_it_overtook_how_long_it_was_held_and_what_let_it_go",
        ),
    ),
    Mutant(
        "trace-claim-untraced-reads-nothing",
        "a claim by a worker that does not trace reads and says nothing of it",
        "llmq/protocol/lua/claim.lua",
        "local traced = ARGV[18] == '1'",
        "local traced = true",
        (
            "tests/test_routing_scripts.py:"
            ":test_a_traced_claim_says_what_it_overtook_how_long_it_was_held_and_what_let_it_go",
        ),
    ),
    Mutant(
        "trace-admission-ahead",
        "llmq.admission says how many requests were queued ahead of the request",
        "api/admission/submit.py",
        'span.set_attribute("llmq.queue.ahead", ahead)',
        "pass",
        ("tests/test_tracing.py::test_a_routed_claims_matched_blocks_are_on_its_queue_wait",),
    ),
    Mutant(
        "quota-take-once",
        "a take run twice (a pipeline sent again) takes the quota once",
        "llmq/protocol/lua/quota_take.lua",
        "if count > 0 and held == count then",
        "if false then",
        ("tests/test_quota.py::test_a_take_is_all_or_none_and_a_return_counts_once",),
    ),
    Mutant(
        "quota-return",
        "what a request did not use, and its place at once, come back when it ends",
        "llmq/protocol/queue.py",
        "        if reserved:\n            await self.quota.give_back(name, request_id, used)\n",
        "",
        (
            "tests/test_quota.py::test_unused_tokens_come_back_when_a_request_ends",
            "tests/test_quota.py::test_a_killed_api_process_leaks_no_places",
        ),
    ),
    Mutant(
        "quota-429",
        "a request over its tenant's limit gets 429 rate_limit_exceeded",
        "api/admission/flow.py",
        "    if verdict.taken:\n"
        "        admission.rate_headers = rate_headers(verdict)\n"
        "        return\n",
        "    if True:\n        return\n",
        (
            "tests/test_quota.py::test_over_the_limit_is_openais_429",
            "tests/test_quota.py::test_processes_share_one_quota",
        ),
    ),
    Mutant(
        "revoked-key",
        "a revoked key is refused within 0.5 s and its stream ends",
        "api/admission/tenancy.py",
        "if hit is not None and hit[0] > time.monotonic():",
        "if hit is not None:",
        (
            "tests/test_tenants.py::test_a_key_is_its_tenants_until_revoked",
            "tests/test_tenants.py::test_a_revoked_key_ends_its_stream",
        ),
    ),
    Mutant(
        "revoked-key-native-stream",
        "a revoked key's native event stream ends, and its request is cancelled",
        "api/routes/native.py",
        "        until=_revoked(request, state, record),\n",
        "",
        ("tests/test_tenants.py::test_a_revoked_key_ends_its_stream[native]",),
    ),
    Mutant(
        "revoked-key-responses-stream",
        "a revoked key's Responses stream ends with an error event",
        "api/routes/responses.py",
        "            until=revoked(admission),\n",
        "",
        ("tests/test_tenants.py::test_a_revoked_key_ends_its_stream[responses]",),
    ),
    Mutant(
        "priority-ceiling",
        "a request may not ask for a priority above its tenant's ceiling",
        "api/admission/flow.py",
        "priority < tenant.min_priority:",
        "priority < tenant.min_priority - 1000:",
        ("tests/test_tenants.py::test_a_key_is_its_tenants_until_revoked",),
    ),
    Mutant(
        "tenants-file-strict",
        "a tenants file's fields are held to the commands' types: weight = \"2\" is refused",
        "llmq/tenants.py",
        'extra="forbid", strict=True)\n\n    name: str',
        'extra="forbid")\n\n    name: str',
        ("tests/test_tenants.py::test_a_wrong_tenants_file_is_refused_whole[weight-a-string]",),
    ),
    Mutant(
        "tenants-file-tables",
        "a tenants file with a misspelled table is refused, not read as no tenants",
        "llmq/tenants.py",
        'extra="forbid", strict=True)\n\n    tenants: dict[str, FileTenant]\n',
        'extra="ignore", strict=True)\n\n    tenants: dict[str, FileTenant] = {}\n',
        ("tests/test_tenants.py::test_a_wrong_tenants_file_is_refused_whole[misspelled-table]",),
    ),
    Mutant(
        "tenants-file-digest",
        "a tenants file's key digest is 32 lowercase hex digits, else the file is refused",
        "llmq/tenants.py",
        "if not DIGEST_PATTERN.match(value):",
        "if False:",
        (
            "tests/test_tenants.py::test_a_wrong_tenants_file_is_refused_whole[digest-not-hex]",
            "tests/test_tenants.py::test_a_wrong_tenants_file_is_refused_whole[digest-too-short]",
        ),
    ),
    Mutant(
        "tenants-file-key-once",
        "a tenants file listing one key digest under two tenants is refused",
        "llmq/tenants.py",
        "                if first != name:\n",
        "                if False:\n",
        ("tests/test_tenants.py::test_a_wrong_tenants_file_is_refused_whole[digest-under-two]",),
    ),
    Mutant(
        "tenants-file-key-moved",
        "a tenants file does not move a key Redis holds for another tenant",
        "llmq/tenants.py",
        "if owner is not None and owner != name:",
        "if False:",
        ("tests/test_tenants.py::test_a_wrong_tenants_file_is_refused_whole[digest-moves-a-key]",),
    ),
    Mutant(
        "tenant-weight-finite",
        "a weight of nan or inf is refused as not finite",
        "llmq/tenants.py",
        "allow_inf_nan=False,",
        "allow_inf_nan=True,",
        ("tests/test_tenants.py::test_a_wrong_tenants_file_is_refused_whole[weight-nan]",),
    ),
    Mutant(
        "tenant-labels-first-read",
        "a fresh process's first concurrent requests are counted under their tenants, not other",
        "llmq/tenants.py",
        "            self._reading = asyncio.create_task(self._read())\n"
        "        if self._reading is not None:\n",
        "            self._reading = asyncio.create_task(self._read())\n"
        "            await self._reading\n"
        "        if False:\n",
        (
            "tests/test_tenants.py::"
            "test_a_fresh_process_labels_its_first_concurrent_requests_by_tenant",
        ),
    ),
    Mutant(
        "shed-by-wait",
        "a request expected to wait longer than LLMQ_SHED_WAIT_SECONDS gets 429 at once",
        "api/admission/flow.py",
        "    if wait_ms <= bound_ms:\n        return\n",
        "    if True:\n        return\n",
        ("tests/test_shedding.py::test_a_request_that_would_wait_too_long_is_refused_at_once",),
    ),
    Mutant(
        "script-slots-order",
        "a script's KEYS and ARGV builder names its slots in the script's order",
        "llmq/protocol/slots.py",
        "    lease_ms: int\n    in_progress_prefix: str\n    in_progress_ms: int\n",
        "    in_progress_prefix: str\n    lease_ms: int\n    in_progress_ms: int\n",
        ("tests/test_slots.py",),
    ),
    Mutant(
        "script-slots-tail-last",
        "a builder's tails follow its named slots (one that declares a tail first is refused)",
        "llmq/protocol/slots.py",
        'raise TypeError(f"{cls.__name__}: a tail or a part comes before a named slot")',
        "pass",
        ("tests/test_slots.py::test_a_builder_with_a_tail_before_a_named_slot_is_refused",),
    ),
    Mutant(
        "publish-call-counts",
        "a flush's publish.lua call counts each request's arguments before them",
        "llmq/protocol/streams.py",
        "argv[count_at] = str(len(argv) - count_at - 1)",
        "argv[count_at] = str(len(argv) - count_at)",
        ("tests/test_slots.py::test_publish_calls_send_each_requests_slots_in_publishs_order",),
    ),
    Mutant(
        "publish-call-order",
        "a flush's publish.lua call writes each request's named slots in Publish's order",
        "llmq/protocol/streams.py",
        'argv += ("", str(w.attempt), *limits)',
        'argv += ("", *limits, str(w.attempt))',
        ("tests/test_slots.py::test_publish_calls_send_each_requests_slots_in_publishs_order",),
    ),
    Mutant(
        "fair-pick",
        "LLMQ_FAIRNESS=vtc: a claim serves the backlogged tenant with the least weighted service",
        "llmq/protocol/lua/claim.lua",
        "local fair_on = fairness == 'vtc'",
        "local fair_on = false",
        ("tests/test_fairness.py",),
    ),
    Mutant(
        "fair-lift",
        "a tenant that was idle is lifted to the floor: it banks no idleness past the window",
        "llmq/protocol/lua/fair.lua",
        "  if own < floor then",
        "  if false then",
        ("tests/test_fairness.py::test_an_idle_tenant_banks_nothing_older_than_its_recent_window",),
    ),
    Mutant(
        "fair-credit",
        "an idle tenant is credited what the others were served of late beyond it",
        "llmq/protocol/lua/fair.lua",
        "    local credit = least and math.max(least - fair_recent(vtc_key, tenant), 0) or 0\n",
        "    local credit = 0\n",
        ("tests/test_fairness.py::test_an_idle_tenant_banks_only_what_the_others_got_of_late",),
    ),
    Mutant(
        "fair-settle",
        "a run's release settles its tenant's charge to the tokens it used",
        "llmq/protocol/lua/fair.lua",
        "  if charged and t and used >= 0 then",
        "  if false then",
        (
            "tests/test_fairness.py::test_a_tenant_is_charged_what_its_requests_used_not_what_they_reserved",
            "tests/test_fairness.py::test_a_workers_finish_settles_the_charge_to_the_tokens_used",
        ),
    ),
    Mutant(
        "fair-settle-worker",
        "a worker's finish tells the release what the request used",
        "llmq/protocol/queue.py",
        "settled = -1 if used is None else used",
        "settled = -1",
        ("tests/test_fairness.py::test_a_workers_finish_settles_the_charge_to_the_tokens_used",),
    ),
    Mutant(
        "fair-charged-once",
        "a request claimed again replaces its earlier charge: charged once in all",
        "llmq/protocol/lua/fair.lua",
        "tostring(c + (tonumber(cost) - earlier) / w)",
        "tostring(c + tonumber(cost) / w)",
        ("tests/test_fairness.py::test_a_request_claimed_again_is_charged_once",),
    ),
    Mutant(
        "api-drain",
        "a stopping API process drains before closing its idle keep-alive connections",
        "api/main.py",
        "            await self.drain()\n",
        "",
        ("tests/test_graceful_stop.py",),
    ),
    Mutant(
        "api-drain-close",
        "while draining, each response closes its connection",
        "api/app.py",
        "            send = _closing(send)\n",
        "            pass\n",
        ("tests/test_graceful_stop.py",),
    ),
    Mutant(
        "fair-requeue",
        "a request handed back or yielded keeps its tenant's turn behind another's backlog",
        "llmq/protocol/lua/requeue.lua",
        "fair_requeue(fair_key, tenants_key, fairq_prefix, id, score)\n",
        "",
        (
            "tests/test_fairness.py::test_a_request_back_in_the_queue_is_claimed_in_its_tenants_turn[hand_back]",
            "tests/test_fairness.py::test_a_request_back_in_the_queue_is_claimed_in_its_tenants_turn[yield]",
        ),
    ),
    Mutant(
        "fair-reap",
        "a request reaped from a dead worker keeps its tenant's turn behind another's backlog",
        "llmq/protocol/lua/reap.lua",
        "    fair_requeue(fair_key, tenants_key, fairq_prefix, id, score)\n",
        "",
        (
            "tests/test_fairness.py::test_a_request_back_in_the_queue_is_claimed_in_its_tenants_turn[reaped]",
        ),
    ),
    Mutant(
        "fair-default",
        "fair share among tenants is on by default",
        "llmq/policy/fields.py",
        'fairness: FairnessName = Field(\n        "vtc",',
        'fairness: FairnessName = Field(\n        "fifo",',
        ("tests/test_fairness.py::test_fair_share_is_on_by_default",),
    ),
    Mutant(
        "fair-unused-weights",
        "under fifo the command and the API say that tenants' weights take no effect",
        "llmq/tenants.py",
        'if fairness == "vtc" or not weighted:',
        "if True:",
        ("tests/test_fairness.py::test_a_weight_that_takes_no_effect_is_said",),
    ),
    Mutant(
        "fair-yield",
        "a full pool gives a slot to a tenant below its share at once (LLMQ_FAIRNESS=vtc)",
        "worker/queue_worker.py",
        "                await self._yield_to_fair_share()\n",
        "",
        (
            "tests/test_fairness.py::test_a_light_tenant_starts_at_once_beside_a_noisy_one_filling_the_pool",
        ),
    ),
    Mutant(
        "finish-used",
        "a worker's finish settles fair share to what its run used without reading the record",
        "llmq/protocol/queue.py",
        'if used is None and self.fairness_for(model) == "vtc" and attempt is not None:',
        'if self.fairness_for(model) == "vtc" and attempt is not None:',
        (
            "tests/test_fairness.py::"
            "test_a_finish_told_what_the_run_used_settles_without_reading_the_record",
        ),
    ),
    Mutant(
        "fair-yield-quiet",
        "a full worker does not ask fair share again while only its runs' tenant waits",
        "worker/queue_worker.py",
        'if only == "" or (only is not None and self.runner.all_of(candidates, only)):',
        "if False:",
        (
            "tests/test_fairness.py::"
            "test_a_full_worker_asks_fair_share_again_only_when_another_tenant_may_wait",
        ),
    ),
    Mutant(
        "fair-yield-woken",
        "a wake-up for another tenant's request makes a full worker ask fair share again",
        "worker/queue_worker.py",
        "if tenant != self._fair_only:",
        "if False:",
        (
            "tests/test_fairness.py::"
            "test_a_light_tenant_starts_at_once_beside_a_noisy_one_filling_the_pool",
        ),
    ),
    Mutant(
        "fair-yield-share",
        "a run gives way only to a tenant holding less of the pool, by weight and service of late",
        "llmq/protocol/lua/fair_yield.lua",
        "p == w_band and share >= 0 then",
        "p == w_band then",
        ("tests/test_fairness.py::test_no_slot_is_given_past_an_even_share",),
    ),
    Mutant(
        "fair-yield-recent",
        "a tenant served less of late may hold more than an even share at once",
        "llmq/protocol/lua/fair.lua",
        "  return math.max(cur + prev * (1 - (now % RECENT_MS) / RECENT_MS), 0)\n",
        "  return 0\n",
        (
            "tests/test_fairness.py::"
            "test_a_tenant_served_less_of_late_may_hold_more_than_an_even_share",
        ),
    ),
    Mutant(
        "fair-yield-band",
        "a run gives way only within its priority band",
        "llmq/protocol/lua/fair_yield.lua",
        "t ~= w_tenant and p == w_band and",
        "t ~= w_tenant and",
        ("tests/test_fairness.py::test_a_slot_is_not_given_across_priority_bands",),
    ),
    Mutant(
        "routing-adaptive-guard",
        "a full holder is not waited for once its wait for a slot outlasts the recompute",
        "llmq/protocol/lua/affinity.lua",
        "  return short * load[3] * 1000 / load[2] > saved * taker[4]\n",
        "  return false\n",
        (
            "tests/test_routing_scripts.py::"
            "test_adaptive_load_guard_weighs_the_holders_wait_against_the_recompute",
        ),
    ),
    Mutant(
        "routing-adaptive-ahead",
        "the holder's wait counts the requests already left for it",
        "llmq/protocol/lua/affinity.lua",
        "local short = load[1] + ahead + 1 - load[2]",
        "local short = load[1] + 1 - load[2]",
        (
            "tests/test_routing_scripts.py::"
            "test_adaptive_load_guard_weighs_the_holders_wait_against_the_recompute",
        ),
    ),
    Mutant(
        "routing-adaptive-unmeasured",
        "a holder is waited for while the claimer's prefill cost is not measured yet",
        "llmq/protocol/lua/affinity.lua",
        "or load[3] == 0 or taker[4] == 0 then",
        "or load[3] == 0 then",
        (
            "tests/test_routing_scripts.py::"
            "test_adaptive_load_guard_waits_for_a_holder_with_a_free_slot_or_no_pace",
        ),
    ),
    Mutant(
        "routing-adaptive-handoff",
        "an arrival is queued for a full holder only while its wait is shorter than the recompute",
        "llmq/protocol/lua/enqueue.lua",
        "and not too_busy(route, loads[w], top_load,",
        "and not too_busy(route, {0, 0, 0, 0}, top_load,",
        ("tests/test_routing_scripts.py::test_adaptive_load_guard_in_the_hand_off",),
    ),
    Mutant(
        "pace-slope",
        "a block's prefill cost is the slope over uncached tokens, not the first token's mean",
        "worker/pace.py",
        "return max(cov / var, 0.0) * BLOCK_SIZE",
        "return mean_y / max(mean_x, 1) * BLOCK_SIZE",
        ("tests/test_pace.py",),
    ),
    Mutant(
        "pace-published",
        "a worker's routing beat publishes the pace it measured",
        "worker/main.py",
        "                pace=runner.pace.now(),\n",
        "",
        ("tests/test_routing.py::test_a_worker_measures_and_publishes_its_pace",),
    ),
    Mutant(
        "fair-yield-once",
        "one waiting request frees one slot, not one per worker",
        "llmq/protocol/lua/fair_yield.lua",
        "if redis.call('EXISTS', yield_prefix .. waiting) == 1 then return false end",
        "",
        ("tests/test_fairness.py::test_a_full_pool_gives_a_slot_to_a_tenant_below_its_share",),
    ),
    Mutant(
        "fair-handed",
        "a request handed straight to a parked worker is charged and counted as running",
        "llmq/protocol/lua/enqueue.lua",
        "    fair_handed(fair_key, vtc_key, id, fair_entry, cost, ttl_ms)\n",
        "",
        ("tests/test_fairness.py::test_a_workers_finish_settles_the_charge_to_the_tokens_used",),
    ),
    Mutant(
        "run-fence-wins",
        "a fenced run stays fenced: no hand-back or cancel moves it (it writes nothing more)",
        "worker/run.py",
        "if self.generation is None or not self._move(RunStatus.HANDING_BACK, LIVE):",
        "if self.generation is None or not self._move(RunStatus.HANDING_BACK, set(RunStatus)):",
        ("tests/test_run.py",),
    ),
    Mutant(
        "chat-route-rendering",
        "a routed chat request's block names are its engine's rendering, not the plain one",
        "api/admission/submit.py",
        "            tokens=choice.rendered,\n",
        "            tokens=None,\n",
        ("tests/test_chat_routing.py",),
    ),
    Mutant(
        "chat-render-closed",
        "the API's chat rendering, closed at shutdown, opens no client (and connection) again",
        "api/chat_render.py",
        "        if self._closed:\n            return None\n",
        "",
        ("tests/test_chat_render.py",),
    ),
    Mutant(
        "batch-embeddings-kept",
        "an embeddings batch line's vectors stay in its stream for a feeder that collects it again",
        "api/batch/batch_run.py",
        "subs[0], keep=True))",
        "subs[0], keep=False))",
        (
            "tests/test_batch.py::test_an_embeddings_lines_vectors_stay_for_a_feeder_that_collects_it_again",
        ),
    ),
    Mutant(
        "policy-follow",
        "a running process follows a change of the pool policy within a second",
        "llmq/policy/live.py",
        "if await stored_policy.version(self.redis) != self.version:",
        "if False:",
        (
            "tests/test_policy.py::test_a_change_reaches_a_running_api_and_worker_within_a_second_losing_nothing",
        ),
    ),
    Mutant(
        "policy-batch-bounds-live",
        "a changed batch bound takes effect on a running API process, without a restart",
        "api/routes/files.py",
        "policy = state.policy.pool()  # a file has no model yet",
        "policy = state.settings  # a file has no model yet",
        ("tests/test_batch.py::test_a_changed_batch_bound_takes_effect_live_without_a_restart",),
    ),
    Mutant(
        "policy-lifetimes-live-publisher",
        "a worker's publisher writes streams under the pool policy's lifetimes as they are "
        "at each flush, not its start-up values",
        "worker/publisher.py",
        "        if self._lifetimes is not None:  # once per flush",
        "        if False:  # once per flush",
        (
            "tests/test_publisher.py::test_a_changed_stream_cap_and_lifetime_apply_at_the_next_flush",
            "tests/test_policy.py::test_changed_lifetimes_reach_a_running_api_and_worker_without_a_restart",
        ),
    ),
    Mutant(
        "policy-lifetimes-live-queue",
        "the API's queue writes a request's record under the pool policy's request_ttl_seconds "
        "as it is at the write, not its start-up value",
        "llmq/protocol/queue.py",
        "return self._ttl if self.policy is None else self.policy.pool().request_ttl_seconds",
        "return self._ttl",
        (
            "tests/test_policy.py::test_changed_lifetimes_reach_a_running_api_and_worker_without_a_restart",
        ),
    ),
    Mutant(
        "policy-lifetimes-pool-wide",
        "a model's override of a pool-wide lifetime is not read",
        "llmq/policy/live.py",
        "            self._pool = store.effective_of(self.stored, None, {}).policy",
        "            self._pool = store.effective_of(self.stored, 'mock', {}).policy",
        (
            "tests/test_policy.py::test_changed_lifetimes_reach_a_running_api_and_worker_without_a_restart",
        ),
    ),
    Mutant(
        "policy-lifetimes-live-responses",
        "a stored response lives as long as the pool policy's request_ttl_seconds at its store",
        "api/routes/responses.py",
        "self.state.redis, stored, self.state.policy.pool().request_ttl_seconds",
        "self.state.redis, stored, self.state.settings.request_ttl_seconds",
        ("tests/test_responses.py::test_stored_under_the_request_ttl",),
    ),
    Mutant(
        "policy-default-tenant-live",
        "a changed default tenant takes effect on a running API process, without a restart",
        "api/app.py",
        "Tenancy(TenantStore(redis), lambda: policy.pool().default_tenant)",
        "Tenancy(TenantStore(redis), lambda: settings.default_tenant)",
        (
            "tests/test_policy.py::test_a_changed_default_tenant_takes_effect_live_without_a_restart",
        ),
    ),
    Mutant(
        "policy-stale-claim",
        "a claim made under a pool policy older than the model's is refused",
        "llmq/protocol/lua/claim.lua",
        "if policy_version < floor then",
        "if false then",
        (
            "tests/test_policy.py::test_a_claim_under_a_stale_version_is_refused_and_made_again_under_the_new",
        ),
    ),
    Mutant(
        "policy-compare-and-set",
        "of two policy changes made at once, neither is lost",
        "llmq/protocol/lua/policy_write.lua",
        "if current ~= expected then",
        "if false then",
        ("tests/test_policy.py::test_concurrent_changes_are_all_kept",),
    ),
    Mutant(
        "policy-validated-whole",
        "a policy change that leaves a model's policy invalid is refused, nothing changed",
        "llmq/policy/store.py",
        "        _check_all(pool, models)\n",
        "",
        ("tests/test_policy.py::test_a_bad_value_is_refused_and_nothing_changes",),
    ),
    Mutant(
        "policy-ignored-differs",
        "a process warns only of the environment values the pool's policy differs from",
        "llmq/policy/live.py",
        "if getattr(pool, name) != value]",
        "]",
        (
            "tests/test_policy.py::"
            "test_the_first_process_seeds_the_policy_from_its_environment_once",
        ),
    ),
    Mutant(
        "policy-seed-once",
        "only the first process seeds the pool policy from its environment",
        "llmq/policy/store.py",
        "await stored_policy.write(redis, 0, {POOL: pool}, who=who, what=what)",
        "await stored_policy.write(\n"
        "        redis, await stored_policy.version(redis), {POOL: pool}, who=who, what=what\n"
        "    )",
        (
            "tests/test_policy.py::test_the_first_process_seeds_the_policy_from_its_environment_once",
            "tests/test_policy.py::test_of_processes_starting_together_on_a_new_pool_one_seeds",
        ),
    ),
    Mutant(
        "policy-derived-limits",
        "a model's token limits are derived from its workers' context length",
        "llmq/policy/derived.py",
        'values["max_prompt_tokens"] = values["max_tokens_limit"] = min(lengths)',
        "pass",
        ("tests/test_policy.py::test_derived_values_come_from_what_the_workers_declare",),
    ),
    Mutant(
        "policy-derived-routing",
        "a model's routing is derived from its workers' engines (prefix where they cache)",
        "llmq/policy/derived.py",
        'values["routing"] = "prefix" if all(caches) else "least-loaded"',
        "pass",
        ("tests/test_policy.py::test_derived_values_come_from_what_the_workers_declare",),
    ),
    Mutant(
        "policy-derived-mock-routing",
        "a pool of mocks derives prefix routing: the mock declares its prefix cache",
        "worker/mock.py",
        "prefix_cache: ClassVar[bool] = True",
        "prefix_cache: ClassVar[bool] = False",
        (
            "tests/test_policy.py::"
            "test_a_pool_of_mocks_derives_prefix_routing_as_their_kv_cache_keeps_prefixes",
        ),
    ),
    Mutant(
        "policy-per-model",
        "each model follows its own overrides of the pool policy",
        "llmq/policy/live.py",
        "found = store.effective_of(self.stored, model, self._declared.get(model, {}))",
        "found = store.effective_of(self.stored, None, self._declared.get(model, {}))",
        ("tests/test_policy.py::test_two_models_on_one_redis_route_as_each_ones_policy_says",),
    ),
)


def copy_tree(dest: Path) -> None:
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(*IGNORED), dirs_exist_ok=True)


def run_tests(copy: Path, tests: Iterable[str], log: Path) -> int:
    """pytest in ``copy``, importing the copy's code (not the editable install's)."""
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    with log.open("wb") as out:
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
        return subprocess.call(cmd, cwd=copy, env=env, stdout=out, stderr=subprocess.STDOUT)


@dataclass
class Outcome:
    mutant: Mutant
    status: str  # killed, survived, stale, error
    seconds: float


def try_mutant(copy: Path, mutant: Mutant, logs: Path) -> Outcome:
    target = copy / mutant.path
    original = target.read_text()
    started = time.monotonic()
    if original.count(mutant.old) != 1:
        return Outcome(mutant, "stale", 0.0)
    target.write_text(original.replace(mutant.old, mutant.new))
    try:
        code = run_tests(copy, mutant.tests, logs / f"{mutant.name}.log")
    finally:
        target.write_text(original)
    # pytest: 1 = tests failed; anything else (usage, collection errors) says nothing
    status = {0: "survived", 1: "killed"}.get(code, "error")
    return Outcome(mutant, status, time.monotonic() - started)


def selection(mutants: Iterable[Mutant]) -> list[str]:
    """Every test the mutants name, once (a node inside a named file is dropped)."""
    named = {t for m in mutants for t in m.tests}
    return sorted(t for t in named if t.split("::")[0] == t or t.split("::")[0] not in named)


def table(outcomes: Sequence[Outcome]) -> str:
    lines = [
        "| mutant | guarantee switched off | tests | result | s |",
        "|---|---|---|---|---|",
    ]
    for o in outcomes:
        tests = ", ".join(f"`{t.removeprefix('tests/')}`" for t in o.mutant.tests)
        lines.append(
            f"| `{o.mutant.name}` | {o.mutant.guarantee} | {tests} | {o.status} | {o.seconds:.0f} |"
        )
    killed = sum(o.status == "killed" for o in outcomes)
    lines.append(f"\n{killed} of {len(outcomes)} mutants killed.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.mutants", description=__doc__)
    parser.add_argument("--only", action="append", default=[], help="run this mutant (repeat)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--keep", action="store_true", help="keep the copy and the logs")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    unknown = set(args.only) - {m.name for m in MUTANTS}
    if unknown:
        parser.error(f"unknown mutants: {', '.join(sorted(unknown))}")
    if args.list:
        for m in chosen:
            print(f"{m.name:28} {m.path:28} {' '.join(m.tests)}")
        return 0
    work = Path(tempfile.mkdtemp(prefix="llmq-mutants-"))
    copy, logs = work / "repo", work / "logs"
    logs.mkdir()
    copy_tree(copy)
    try:
        selected = selection(chosen)
        print(f"baseline: {' '.join(selected)}", flush=True)
        started = time.monotonic()
        # twice at most: on a shared machine a timing test may fail once by itself
        if all(run_tests(copy, selected, logs / "baseline.log") != 0 for _ in range(2)):
            print((logs / "baseline.log").read_text()[-4000:])
            print("the unmodified tests fail: fix them before judging mutants")
            return 2
        print(f"baseline passed ({time.monotonic() - started:.0f} s)", flush=True)
        outcomes = []
        for mutant in chosen:
            outcome = try_mutant(copy, mutant, logs)
            print(f"{mutant.name}: {outcome.status} ({outcome.seconds:.0f} s)", flush=True)
            outcomes.append(outcome)
        print()
        print(table(outcomes))
        print(f"{time.monotonic() - started:.0f} s in all.")
        bad = [o for o in outcomes if o.status != "killed"]
        if bad and args.keep:
            print(f"logs: {logs}")
        return 1 if bad else 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
