#!/usr/bin/env bash
# `make lint`'s check of the Prometheus rules (deploy/prometheus/rules/) with promtool,
# which Debian's prometheus package ships (scripts/system-deps.sh installs it). Where
# promtool is absent the check is skipped with a line saying so, except under CI=true,
# where it fails. tests/test_alert_rules.py runs the rules' unit tests.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v promtool >/dev/null; then
  if [ "${CI:-}" = "true" ]; then
    echo "check-rules: promtool is missing (Debian package prometheus)" >&2
    exit 1
  fi
  echo "check-rules: promtool absent, rules not checked (Debian package prometheus)"
  exit 0
fi
promtool check rules deploy/prometheus/rules/*.yml
