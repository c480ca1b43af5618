"""Each script's KEYS and ARGV builder (:mod:`llmq.protocol.slots`) against the script.

The builder's slot names, in order, must be the script's own ``local x = KEYS[n]`` /
``local x = ARGV[n]`` names at those positions: a slot out of order, missing or extra
fails here, before any Redis test meets a script reading the wrong argument.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, fields
from importlib import resources
from types import SimpleNamespace
from typing import ClassVar, get_args

import pytest

from llmq.protocol import keys, slots, streams
from llmq.protocol.routing import POLICIES, PolicyName
from llmq.protocol.scripts import NAMES, Scripts
from llmq.protocol.slots import Slots

pytestmark = pytest.mark.timeout(30)

#: ``local name = KEYS[3]``, ``local name = tonumber(ARGV[k + 2])`` ...
LOCAL = re.compile(r"^\s*local (\w+) = (?:tonumber\()?(KEYS|ARGV)\[(?:[ak] \+ )?(\d+)\]")

BUILDERS: list[type[Slots]] = [
    c
    for c in vars(slots).values()
    if isinstance(c, type) and issubclass(c, Slots) and c is not Slots and c.SCRIPT
]


def declared(script: str) -> tuple[list[str], list[str]]:
    """The script's named KEYS and ARGV, by position (1-based, no gaps allowed)."""
    text = (resources.files("llmq.protocol") / "lua" / f"{script}.lua").read_text()
    found: dict[str, dict[int, str]] = {"KEYS": {}, "ARGV": {}}
    for line in text.splitlines():
        m = LOCAL.match(line)
        if m:
            name, table, n = m.group(1), m.group(2), int(m.group(3))
            assert n not in found[table], f"{script}.lua names {table}[{n}] twice"
            found[table][n] = name
    out = []
    for table in ("KEYS", "ARGV"):
        by_n = found[table]
        assert sorted(by_n) == list(range(1, len(by_n) + 1)), f"{script}.lua: {table} gaps"
        out.append([by_n[n] for n in sorted(by_n)])
    return out[0], out[1]


def test_every_script_has_exactly_one_builder() -> None:
    assert sorted(b.SCRIPT for b in BUILDERS) == sorted(NAMES)
    assert {f.name for f in fields(Scripts)} == set(NAMES)


@pytest.mark.parametrize("builder", BUILDERS, ids=lambda b: b.SCRIPT)
def test_a_builder_names_its_scripts_slots_in_the_scripts_order(builder: type[Slots]) -> None:
    assert builder.names() == declared(builder.SCRIPT)


def test_the_check_fails_on_a_builder_with_two_slots_swapped() -> None:
    keys_, args = slots.Claim.names()
    swapped = (keys_, [args[1], args[0], *args[2:]])
    assert swapped != declared("claim")


def named(cls: type[Slots], **given: object) -> Slots:
    """A builder whose every named slot holds its own name."""
    return cls(**{f.name: f.name for f in fields(cls) if f.name not in given}, **given)


def test_a_builder_puts_each_value_at_its_slot_and_its_part_after_its_own() -> None:
    claim = named(slots.Claim, route=named(slots.ClaimRoute))
    assert claim.call() == slots.Claim.names()
    enqueue = named(slots.Enqueue, route=named(slots.EnqueueRoute))
    assert enqueue.call() == slots.Enqueue.names()
    keys_, args = named(slots.Claim, route=None).call()
    assert (keys_, args) == (keys_[:12], args[:18]) and len(keys_) == 12 and len(args) == 18


def test_a_tail_is_spread_last_and_a_keys_tail_after_the_named_keys() -> None:
    flush = slots.MetricsFlush("m", "w", "n", 1, 2, 5, 0, families=["f1", "f2"], deltas=[3, "x", 4])
    assert flush.call() == (["m", "w", "n", "f1", "f2"], [1, 2, 5, 0, 3, "x", 4])


def test_a_builder_with_a_tail_before_a_named_slot_is_refused() -> None:
    """Named slots are read off a builder in one go each, then its tails: a tail
    declared before a named slot would land after it, so such a builder is refused."""

    @dataclass(frozen=True)
    class Misordered(slots.Slots):
        SCRIPT: ClassVar[str] = "misordered"
        first_key: str
        rest: Sequence[str] = slots.tail()
        last: str = ""

    with pytest.raises(TypeError, match="comes before a named slot"):
        Misordered("k", ["a"], "b").call()


def test_publish_calls_send_each_requests_slots_in_publishs_order() -> None:
    """A flush's ``EVALSHA`` of publish.lua carries, per request, its keys and then its
    argument count and arguments (:func:`llmq.protocol.streams.publish_calls`): each
    request's must read as :class:`slots.Publish` names them, counts included."""
    record = {"a": "b"}
    writes = {
        rid: SimpleNamespace(attempt=n + 7, events=[], record=record, notes=[])
        for n, rid in enumerate(("req-1", "req-2"))
    }
    ((command, ids),) = streams.publish_calls(
        "sha", writes, ttl=8, maxlen=9, lifecycle_maxlen=10, by_slot=False
    )
    assert ids == ["req-1", "req-2"]
    key_names, arg_names = slots.Publish.names()
    n_keys = command[2]
    assert n_keys == 2 * len(key_names)
    call_keys, argv = list(command[3 : 3 + n_keys]), list(command[3 + n_keys :])
    for n, rid in enumerate(ids):
        by_key = dict(zip(key_names, call_keys[n * 4 : n * 4 + 4], strict=True))
        assert by_key == {
            "stream_key": keys.stream(rid),
            "record_key": keys.request(rid),
            "fence_key": keys.fence(rid),
            "lifecycle_key": keys.lifecycle(rid),
        }
        count = int(argv.pop(0))
        args, argv = argv[:count], argv[count:]
        assert {k: str(v) for k, v in zip(arg_names, args, strict=False)} == {
            "attempt": str(n + 7),
            "ttl": "8",
            "maxlen": "9",
            "lifecycle_maxlen": "10",
            "n_events": "0",
            "n_record": "1",
            "n_notes": "0",
        }
        assert args[len(arg_names) :] == ["a", "b"]
    assert argv == []


def test_every_routing_policy_has_one_function_in_the_scripts_by_its_one_name() -> None:
    """The routed scripts look a policy up by the name LLMQ_ROUTING gives it
    (``lua/affinity.lua``'s POLICIES); fifo routes nothing and has none."""
    text = (resources.files("llmq.protocol") / "lua" / "affinity.lua").read_text()
    table = text[text.index("local POLICIES = {") :]
    in_lua = re.findall(r"^  \['([\w-]+)'\] = \{\n    rank = function", table, re.MULTILINE)
    assert sorted(in_lua) == sorted(set(POLICIES) - {"fifo"})
    assert set(POLICIES) == set(get_args(PolicyName))
