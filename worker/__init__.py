"""The llmq worker: an arq worker that runs the model and publishes token streams."""
