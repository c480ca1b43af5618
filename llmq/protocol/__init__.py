"""The queue protocol: every key, shared value, Lua script and queue operation.

The API and the workers call it; it imports nothing of theirs.
"""
