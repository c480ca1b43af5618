"""The routing benchmark's synthetic workloads, and the ideal scheduler's hit rate.

Five seeded workloads, each a list of :class:`Conversation`: one that
sends one request, or several turns whose prompt is the whole history so far
(sent after the previous turn ended and a think time). Prompts are whitespace
words, the mock's tokens, so that the API's block names are the engine's.

- ``shared``: ``systems`` system prompts of ``system_tokens`` words, a short
  question each; Poisson arrivals.
- ``chat``: ``sessions`` sessions of ``turns`` turns; each turn's prompt is the
  history (the previous prompt, the answer, the next question).
- ``distinct``: every prompt its own (the control: nothing to share).
- ``hot``: one system prompt carries ``hot_share`` of the traffic, the rest spread
  over the others.
- ``tenants``: a few tenants, each asking about its own long document, one of them
  hot (``hot_share`` of the traffic): the load guard's trade-off, a hot prefix that
  one worker cannot serve alone against caches too small for every document.

The ideal hit rate (:func:`ideal_hit_rate`) is an upper bound that no scheduler
beats: one unbounded cache seen by every request, so a request hits every leading
block that any earlier request's prompt had (by chained block names, as the engine
caches them). A real cluster of bounded caches can at best approach it.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field

from llmq.model.blocks import block_hashes


@dataclass(frozen=True)
class Conversation:
    """One client's requests: ``start_s`` after the run begins, then each next turn
    ``think_s`` after the previous one ended (its prompt: history + answer + question)."""

    start_s: float
    questions: tuple[str, ...]
    #: Text before the first question (a system prompt; "" for none).
    system: str = ""
    session: str | None = None
    think_s: float = 0.0
    max_tokens: int = 24


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    conversations: tuple[Conversation, ...] = field(default=())

    @property
    def requests(self) -> int:
        return sum(len(c.questions) for c in self.conversations)


def _words(rng: random.Random, tag: str, n: int) -> str:
    return " ".join(f"{tag}{rng.randrange(10**9):x}" for _ in range(n))


def _arrivals(rng: random.Random, rate: float, n: int) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def shared(
    rate: float, requests: int, *, systems: int = 16, system_tokens: int = 1500, seed: int = 1
) -> Workload:
    rng = random.Random(seed)
    prompts = [_words(rng, f"s{i}-", system_tokens) for i in range(systems)]
    convs = tuple(
        Conversation(t, (_words(rng, "q", rng.randint(8, 24)),), system=rng.choice(prompts))
        for t in _arrivals(rng, rate, requests)
    )
    return Workload("shared", f"{systems} shared system prompts of {system_tokens} tokens", convs)


def _hot_prefix(
    rate: float, requests: int, systems: int, system_tokens: int, hot_share: float, seed: int
) -> tuple[Conversation, ...]:
    """Short questions after one of ``systems`` prompts, the first with ``hot_share``."""
    rng = random.Random(seed)
    prompts = [_words(rng, f"h{i}-", system_tokens) for i in range(systems)]
    return tuple(
        Conversation(
            t,
            (_words(rng, "q", rng.randint(8, 24)),),
            system=prompts[0] if rng.random() < hot_share else rng.choice(prompts[1:]),
        )
        for t in _arrivals(rng, rate, requests)
    )


def hot(
    rate: float,
    requests: int,
    *,
    systems: int = 16,
    system_tokens: int = 1500,
    hot_share: float = 0.6,
    seed: int = 4,
) -> Workload:
    convs = _hot_prefix(rate, requests, systems, system_tokens, hot_share, seed)
    return Workload("hot", f"one hot prefix with {hot_share:.0%} of the traffic", convs)


def tenants(
    rate: float,
    requests: int,
    *,
    tenants: int = 4,
    document_tokens: int = 4000,
    hot_share: float = 0.55,
    seed: int = 5,
) -> Workload:
    convs = _hot_prefix(rate, requests, tenants, document_tokens, hot_share, seed)
    title = (
        f"{tenants} tenants' documents of {document_tokens} tokens, one with {hot_share:.0%}"
        " of the traffic"
    )
    return Workload("tenants", title, convs)


def distinct(rate: float, requests: int, *, prompt_tokens: int = 1500, seed: int = 3) -> Workload:
    rng = random.Random(seed)
    convs = tuple(
        Conversation(t, (_words(rng, f"d{i}-", prompt_tokens),))
        for i, t in enumerate(_arrivals(rng, rate, requests))
    )
    return Workload("distinct", "no sharing (every prompt distinct): the control", convs)


def chat(
    session_rate: float,
    sessions: int = 64,
    *,
    turns: int = 6,
    system_tokens: int = 200,
    think_s: float = 2.0,
    max_tokens: int = 48,
    seed: int = 2,
) -> Workload:
    rng = random.Random(seed)
    convs = tuple(
        Conversation(
            t,
            tuple(_words(rng, "u", rng.randint(16, 32)) for _ in range(turns)),
            system=_words(rng, f"c{i}-", system_tokens),
            session=f"session-{i}",
            think_s=think_s,
            max_tokens=max_tokens,
        )
        for i, t in enumerate(_arrivals(rng, session_rate, sessions))
    )
    return Workload("chat", f"{sessions} chat sessions of {turns} turns", convs)


def ideal_hit_rate(prompts: Iterable[str]) -> float:
    """Prompt tokens an unbounded, shared cache would hold, over all prompt tokens, for
    ``prompts`` in the order they were sent (the upper bound of any scheduler)."""
    seen: set[str] = set()
    hit = total = 0
    for prompt in prompts:
        tokens = prompt.split()
        names = block_hashes(tokens)
        held = 0
        while held < len(names) and names[held] in seen:
            held += 1
        hit += held * 16
        total += len(tokens)
        seen.update(names)
    return hit / total if total else 0.0
