"""What tests share: helpers over the native API and SSE, polls with a deadline,
process handles, the in-process servers' types, raw queue jobs and the many-host
cluster's client. Tests import from here, never from each other or ``conftest``."""
