"""What the benchmarks read of the scheduler: a thread's time on a CPU and off it."""

from __future__ import annotations

import os
import threading
import time

import pytest

from bench.sysinfo import ThreadSched, busiest_thread, thread_sched


@pytest.mark.timeout(30)
def test_the_busiest_thread_is_the_one_that_ran() -> None:
    spinning: list[int] = []

    def spin() -> None:
        spinning.append(threading.get_native_id())
        deadline = time.process_time() + 0.3  # this process's CPU: it ran, however busy the machine
        while time.process_time() < deadline:
            pass

    thread = threading.Thread(target=spin)
    thread.start()  # running before the first reading, so it is in both
    while not spinning:
        time.sleep(0.001)
    before = thread_sched(os.getpid())
    time.sleep(0.1)  # this thread sleeps meanwhile: its CPU time stays small
    after = thread_sched(os.getpid())
    thread.join()
    assert spinning[0] in before and threading.get_native_id() in after
    busiest = busiest_thread(before, after)
    assert busiest == after[spinning[0]] - before[spinning[0]]
    assert busiest.cpu_s > 0 and busiest.slices >= 1
    # the two files are read in turn: the counts may disagree by a switch or two
    assert busiest.preempted == max(0, busiest.slices - busiest.voluntary)


@pytest.mark.timeout(10)
def test_preempted_is_never_below_zero_when_the_two_files_disagree() -> None:
    # schedstat read before status: one voluntary switch more than the slices counted
    assert ThreadSched(cpu_s=0.1, waited_s=0.0, slices=27, voluntary=28).preempted == 0
    assert ThreadSched(cpu_s=0.1, waited_s=0.0, slices=30, voluntary=28).preempted == 2
