"""A run's status moves only as :mod:`worker.run` draws it: each transition from the
states it allows, the model stopped when a run leaves RUNNING for good, a pause
answered when it ends."""

from __future__ import annotations

import asyncio

from llmq.schema import FinishReason
from tests.support.runs import payload
from worker.run import Run, RunStatus


def status(run: Run) -> RunStatus:
    """The run's status now (read afresh: a transition changed it)."""
    return run.status


async def _generating() -> Run:
    """A run whose model generates (a task that waits until cancelled)."""

    async def forever() -> FinishReason:
        await asyncio.Event().wait()
        return "stop"

    run = Run(payload("r", max_tokens=10, seed=1), attempt=1)
    run.generation = asyncio.create_task(forever())
    await asyncio.sleep(0)
    return run


async def _stopped(run: Run) -> bool:
    assert run.generation is not None
    await asyncio.sleep(0)
    return run.generation.cancelled()


async def test_a_cancel_stops_the_model_and_a_later_cancel_or_finish_does_not_undo_it() -> None:
    run = await _generating()
    assert run.cancel() and status(run) is RunStatus.CANCELLED
    assert await _stopped(run)
    run.finish()  # the "cancelled" terminal event
    assert status(run) is RunStatus.FINISHED
    assert not run.cancel() and status(run) is RunStatus.FINISHED


async def test_a_fence_wins_over_every_state_and_a_fenced_run_stays_fenced() -> None:
    for first in (Run.cancel, Run.hand_back, Run.finish):
        run = await _generating()
        first(run)
        assert run.fence() and run.fenced
        run.finish()
        assert run.cancel() is False and run.hand_back() is False
        assert not run.stop_unfinished(interrupted=True)
        assert status(run) is RunStatus.FENCED
        assert not run.fence()  # once


async def test_a_hand_back_wins_over_a_cancel_but_not_the_other_way() -> None:
    run = await _generating()
    run.cancel()
    assert run.hand_back() and status(run) is RunStatus.HANDING_BACK
    assert not run.cancel() and status(run) is RunStatus.HANDING_BACK


async def test_a_pause_stops_the_model_and_its_end_answers_the_waiting_run() -> None:
    run = await _generating()
    assert run.pause_for_lease() and status(run) is RunStatus.PAUSING
    assert await _stopped(run)
    assert not run.pause_for_lease()  # paused once until the verdict is taken
    waiting = asyncio.create_task(run.wait_pause())
    assert run.resume() and status(run) is RunStatus.RUNNING
    assert await waiting is True and run.pause is None

    run = await _generating()
    run.pause_for_lease()
    waiting = asyncio.create_task(run.wait_pause())
    run.cancel()
    assert await waiting is False and status(run) is RunStatus.CANCELLED
    assert not run.resume()


async def test_only_a_generating_run_pauses_or_is_handed_back() -> None:
    run = Run(payload("r", max_tokens=10, seed=1), attempt=1)
    assert not run.pause_for_lease() and not run.hand_back()
    assert not run.cancel()  # nothing generating: False, but the cancel holds
    assert status(run) is RunStatus.CANCELLED


async def test_a_run_ended_without_its_terminal_event_is_unfinished_unless_over() -> None:
    run = await _generating()
    assert run.stop_unfinished(interrupted=True) and run.interrupted
    assert status(run) is RunStatus.UNFINISHED
    run = await _generating()
    run.finish()
    assert not run.stop_unfinished(interrupted=False) and run.over
