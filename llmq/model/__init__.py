"""The model's declaration, shared by the API and the workers.

- :mod:`llmq.model.interface`: what a backend implements (:class:`~llmq.model.interface.Backend`),
  the request it is given, the capabilities it may declare.
- :mod:`llmq.model.tokenizer`: how prompts are counted, the same on both sides.
- :mod:`llmq.model.json_subset`: the JSON Schema subset structured output honours.

Implementations live in ``worker/`` (the mock in ``worker.mock``).
"""
