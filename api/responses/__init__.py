"""OpenAI's Responses API: its input, its output format, its relay, stored responses."""
