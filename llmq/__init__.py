"""llmq: the contract shared by the API, the workers and the load generator.

Everything two processes must agree on lives here: settings, Redis key names, the
job payload and the stream event schema. Neither side imports the other.
"""

__version__ = "0.1.0"
