"""llmq: the contract shared by the API, the workers and the load generator.

Everything two processes must agree on lives here: settings, the job payload and
the stream event schema, and the queue protocol (:mod:`llmq.protocol`: Redis key
names, the Lua scripts and every step of a request's path through the queue).
Neither side imports the other.
"""

__version__ = "0.1.0"
