"""The pool policy: how the pool behaves, stored once in Redis, the same for every
process, changed live (docs/policy.md).

- :mod:`llmq.policy.fields`: the fields, which the settings carry too (they seed it);
- :mod:`llmq.policy.model`: the validated :class:`~llmq.policy.model.Policy` and the
  effective policy of a model with the source of each value;
- :mod:`llmq.policy.store`: reading, changing (compare-and-set, with a history),
  seeding and the TOML file;
- :mod:`llmq.policy.live`: what a running process holds, followed within a second;
- :mod:`llmq.policy.derived`: the values the workers' declarations give.

Nothing here is imported by :mod:`llmq.settings` but the fields, so a process's
start-up does not pay for Redis clients it has not made.
"""
