#!/usr/bin/env bash
# A Docker engine for the compose stack test (tests/test_compose_stack.py) and for
# `docker compose up` on machines without a Docker service (docs/compose.md).
#
#   dockerd.sh start        start dockerd unless an engine already answers
#   dockerd.sh stop         stop the dockerd that `start` started (none other)
#   dockerd.sh run CMD...   CMD with an engine up; stops it after if it started it
#
# Containers get addresses in the benchmarking range alone (198.19.0.0/16, beside
# the network-namespace hosts' 198.18.x): the default bridge by --bip, compose's
# networks from --default-address-pool; never Docker's default private ranges.
# --iptables=false and --ip-forward=false leave the machine's firewall and
# forwarding as they are (other tests' namespace bridges share them) and give
# containers no route off the machine: published ports work through docker-proxy,
# and image builds reach the package index on the host's network (the compose
# file's build network: host). Needs root; installs docker.io where missing
# (scripts/system-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

PIDFILE=/run/llmq-dockerd.pid
LOG=${LLMQ_DOCKERD_LOG:-/tmp/llmq-dockerd.log}
SOCKET=/var/run/docker.sock

log() { echo "dockerd.sh: $*" >&2; }

answers() { DOCKER_HOST=unix://$SOCKET docker info >/dev/null 2>&1; }

ours() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

start() {
  if answers; then
    ours && log "dockerd (pid $(cat "$PIDFILE")) already running" ||
      log "a Docker engine already answers on $SOCKET; using it as it is"
    return 0
  fi
  if [ "$(id -u)" -ne 0 ]; then
    log "no Docker engine answers, and starting one needs root"
    return 1
  fi
  if ! command -v dockerd >/dev/null || ! command -v docker >/dev/null; then
    bash scripts/system-deps.sh
  fi
  rm -f "$PIDFILE"
  setsid dockerd \
    --host "unix://$SOCKET" \
    --pidfile "$PIDFILE" \
    --bip 198.19.0.1/24 \
    --default-address-pool base=198.19.0.0/16,size=24 \
    --iptables=false \
    --ip-forward=false \
    </dev/null >>"$LOG" 2>&1 &
  local pid=$!
  for _ in $(seq 120); do
    if answers; then
      log "dockerd started (pid $pid, log $LOG)"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      break
    fi
    sleep 0.5
  done
  log "dockerd did not come up; the end of $LOG:"
  tail -n 20 "$LOG" >&2
  kill "$pid" 2>/dev/null || true
  return 1
}

stop() {
  if ! ours; then
    rm -f "$PIDFILE"
    return 0
  fi
  local pid
  pid=$(cat "$PIDFILE")
  kill -TERM "$pid"
  # dockerd stops its containers (their own grace periods) and its containerd first.
  for _ in $(seq 120); do
    kill -0 "$pid" 2>/dev/null || { log "dockerd stopped"; return 0; }
    sleep 0.5
  done
  log "dockerd (pid $pid) did not stop within 60 s; killing it"
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$PIDFILE"
}

case ${1:-} in
  start) start ;;
  stop) stop ;;
  run)
    shift
    [ $# -gt 0 ] || { log "usage: dockerd.sh run CMD..."; exit 2; }
    started=0
    if ! answers; then
      # Without an engine CMD still runs: the tests that need one fail and say why.
      start && started=1 || log "continuing without a Docker engine"
    fi
    if [ $started -eq 1 ]; then
      trap stop EXIT
    fi
    status=0
    "$@" || status=$?
    exit $status
    ;;
  *)
    log "usage: dockerd.sh start|stop|run CMD..."
    exit 2
    ;;
esac
