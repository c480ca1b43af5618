"""The llmq HTTP API: OpenAI-compatible and native endpoints over the Redis queue."""
