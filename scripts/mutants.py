"""Switch off each guarded feature in a copy of the repository and check the tests notice.

Every entry of :data:`MUTANTS` names one guarantee the README states, the exact
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


#: One entry per guarantee. To retarget after a refactor, change ``path``/``old``/``new``.
MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "admission-budget-worker",
        "a worker claims only what fits its token budget (worker side)",
        "worker/queue_worker.py",
        "budget_left=self.token_budget - self.tokens_in_use if self.token_budget else None",
        "budget_left=None",
        ("tests/test_budget.py",),
    ),
    Mutant(
        "admission-budget-script",
        "the claim script skips a request over the budget left",
        "llmq/scripts.py",
        "if budget >= 0 and ARGV[6] ~= '1' and tonumber(cost) > budget then",
        "if false then",
        ("tests/test_budget.py",),
    ),
    Mutant(
        "relay-index-skip",
        "an OpenAI client sees every token exactly once (the relay skips sent indexes)",
        "api/follow.py",
        "skip = self.next_index - event.index",
        "skip = 0",
        ("tests/test_exactly_once.py",),
    ),
    Mutant(
        "mid-stream-error",
        "a stream failing mid-way ends with an error chunk, then [DONE]",
        "api/routes/openai.py",
        'yield sse.data(error_body(message, "server_error", None, "stream_failed"))\n'
        "        yield sse.DONE",
        "raise",
        ("tests/test_stream_failure.py",),
    ),
    Mutant(
        "cancel-latency",
        "a cancelled running request stops within about one token interval",
        "worker/runner.py",
        "            return False\n        task.cancel()",
        "            return False\n        asyncio.get_running_loop().call_later(0.1, task.cancel)",
        ("tests/test_cancel_latency.py",),
    ),
    Mutant(
        "client-closed-499",
        "a non-streaming client that disconnects is answered 499 and its request cancelled",
        "api/routes/openai.py",
        "release_later(state, fmt.sub.model, fmt.sub.id, cancel=response is None)",
        "release_later(state, fmt.sub.model, fmt.sub.id, cancel=False)",
        ("tests/test_cancel_latency.py",),
    ),
    Mutant(
        "hand-back-score",
        "a stopping worker hands requests back at their original score",
        "worker/queue_worker.py",
        "await self.queue.requeue(self.model, job_id, score, cost)",
        "await self.queue.requeue(self.model, job_id, score + 60_000, cost)",
        ("tests/test_handback.py",),
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
        selected = sorted({t for m in chosen for t in m.tests})
        print(f"baseline: {' '.join(selected)}", flush=True)
        if run_tests(copy, selected, logs / "baseline.log") != 0:
            print((logs / "baseline.log").read_text()[-4000:])
            print("the unmodified tests fail: fix them before judging mutants")
            return 2
        outcomes = []
        for mutant in chosen:
            outcome = try_mutant(copy, mutant, logs)
            print(f"{mutant.name}: {outcome.status} ({outcome.seconds:.0f} s)", flush=True)
            outcomes.append(outcome)
        print()
        print(table(outcomes))
        bad = [o for o in outcomes if o.status != "killed"]
        if bad and args.keep:
            print(f"logs: {logs}")
        return 1 if bad else 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
