#!/usr/bin/env bash
# Installs the Debian packages some tests use: docker-compose and prometheus.
# Needs root and apt-get; does nothing when both tools are already present.
set -euo pipefail
missing=()
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v prometheus >/dev/null || missing+=(prometheus)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "system-deps: need root and apt-get to install ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
