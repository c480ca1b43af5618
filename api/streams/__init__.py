"""Relaying what workers write: a request's stream to its client, the fan-in of
several choices, following and resuming, the server-sent events themselves."""
