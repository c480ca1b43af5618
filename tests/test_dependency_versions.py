"""arq and redis-py are the releases whose pins and workarounds were checked.

arq 0.28.0, its latest release, requires ``redis[hiredis]<6``; so llmq runs redis-py
5.x with a subclass of its private hiredis parser (``PooledReplyParser`` in
``llmq/connection.py``), and ``worker/queue_worker.py`` goes around arq in the places
it lists. A new release of either fails here on purpose: re-check what
docs/development.md ("arq and redis-py") lists, then update these versions. (That the
parser's private parts still behave is ``tests/test_pool.py``'s.)
"""

from __future__ import annotations

from importlib.metadata import requires, version

#: The releases checked, and what arq declares it needs of redis-py.
ARQ = "0.28.0"
REDIS = "5.3.1"
ARQ_NEEDS = "redis[hiredis]<6,>=4.2.0"

RECHECK = (
    "a new {name} release ({found}, checked: {checked}): re-check what docs/development.md "
    "lists under 'arq and redis-py' (can the pins lift, and PooledReplyParser go?), "
    "then update tests/test_dependency_versions.py"
)


def test_arq_is_the_release_checked_and_still_holds_redis_py_below_6() -> None:
    found = version("arq")
    assert found == ARQ, RECHECK.format(name="arq", found=found, checked=ARQ)
    needs = [r for r in requires("arq") or [] if r.startswith("redis")]
    assert needs == [ARQ_NEEDS], f"arq now declares {needs}: can redis-py go past 5?"


def test_redis_py_is_the_release_checked() -> None:
    found = version("redis")
    assert found == REDIS, RECHECK.format(name="redis-py", found=found, checked=REDIS)
