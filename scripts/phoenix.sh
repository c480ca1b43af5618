#!/usr/bin/env bash
# Installs Arize Phoenix (`arize-phoenix` on PyPI), the trace backend the tracing tests
# send spans to over OTLP/HTTP and read back over its REST API (tests/test_tracing.py),
# in a virtual environment of its own, and caches it under ~/.cache/llmq/, keyed by
# version. Prints the path of its `phoenix` executable.
#
# Its own environment: Phoenix brings a web server, a database layer and data-science
# libraries that llmq's environment has no use for.
#
#   PHOENIX_VERSION  the release (default below)
#   LLMQ_CACHE       cache root (default ~/.cache/llmq)
set -euo pipefail

version="${PHOENIX_VERSION:-20.26.1}"
cache="${LLMQ_CACHE:-$HOME/.cache/llmq}"
dest="$cache/phoenix-$version"
phoenix="$dest/bin/phoenix"

if [[ -x "$phoenix" && -f "$dest/.installed" ]]; then
    echo "$phoenix"
    exit 0
fi

rm -rf "$dest"
"${PYTHON:-python3}" -m venv "$dest"
"$dest/bin/python" -m pip install -q "arize-phoenix==$version" >&2
"$dest/bin/python" -c "import phoenix.server.main" >&2
touch "$dest/.installed"
echo "$phoenix"
