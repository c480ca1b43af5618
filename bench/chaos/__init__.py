"""A randomized fault campaign (Jepsen's method) on the many-host cluster.

Clients run native and OpenAI streams while a nemesis injects faults at random
times drawn from a seed; every client records what it saw (:mod:`.history`), and
a checker (:mod:`.checker`), a pure function of that history, judges it whole.
:mod:`.nemesis` holds the fault kinds, :mod:`.clients` the clients, and
:mod:`.campaign` starts the stack and runs the three together. The scenario is
``python -m bench --scenarios chaos`` (see docs/chaos.md).
"""
