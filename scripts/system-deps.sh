#!/usr/bin/env bash
# Installs the Debian packages some tests use: docker.io and docker-compose (the
# compose stack test runs docker-compose.yml on a real engine), mmdebstrap (its
# stand-in base images, scripts/standin-images.sh), prometheus (to scrape
# /metrics; its promtool checks and tests the alerting rules), linux-perf (python -m
# bench.first_token_cpu) and chromium (the console's browser tests drive it headless). Needs root and
# apt-get; does nothing when every tool is present.
set -euo pipefail
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
{ command -v prometheus && command -v promtool; } >/dev/null || missing+=(prometheus)
command -v perf >/dev/null || missing+=(linux-perf)
command -v chromium >/dev/null || missing+=(chromium)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "system-deps: need root and apt-get to install ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
