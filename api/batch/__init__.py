"""OpenAI's Batch API over the queue: input files, their lines, the feeder that
admits them in the batch band, and their results."""
