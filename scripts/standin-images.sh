#!/usr/bin/env bash
# Makes the base images that docker-compose.yml, deploy/compose/llamacpp.yml and the
# Dockerfile name (python:3.11-slim, redis:7-alpine, ghcr.io/ggml-org/llama.cpp:server)
# available to the local Docker engine.
#
# An image already present (the real one, or a stand-in made before) is left as it
# is; a missing one is pulled. Only where the pull fails (no registry reachable, as
# on machines that reach Debian's package archive alone) is a stand-in built from
# Debian bookworm packages with mmdebstrap and tagged under the same name:
#   python:3.11-slim  Debian's Python 3.11 with a venv at /usr/local, so `python`,
#                     `pip` and the commands pip installs are on PATH as in the
#                     official image; passwd for useradd; the host's CA certificates,
#                     so pip inside `docker build` trusts a TLS-intercepting proxy.
#   redis:7-alpine    Debian's redis-server 7.0, run as the redis user from /data with
#                     --protected-mode no, as the official image's entrypoint does.
#   ghcr.io/ggml-org/llama.cpp:server
#                     the llama-server that scripts/llama-server.sh builds (the one the
#                     upstream tests run), at /app/llama-server as the entrypoint, with
#                     curl for the compose file's health check.
# Stand-ins carry the label org.llmq.standin; `docker rmi` them to pull the real
# ones later. Needs root (mmdebstrap) and a running engine (scripts/dockerd.sh).
set -euo pipefail

STANDIN_LABEL=org.llmq.standin
SUITE=bookworm

log() { echo "standin-images: $*" >&2; }

present() { docker image inspect "$1" >/dev/null 2>&1; }

pulled() {
  local image=$1
  log "pulling $image"
  if timeout 120 docker pull -q "$image" >/dev/null 2>&1; then
    return 0
  fi
  log "cannot pull $image; building a stand-in from Debian $SUITE packages"
  return 1
}

# mmdebstrap SUITE to stdout as a tar, imported under NAME with the image config
# given as `docker import --change` lines.
build() {
  local name=$1
  shift
  local -a includes=() hooks=() changes=()
  while [ $# -gt 0 ]; do
    case $1 in
      --include) includes+=("$2") ;;
      --hook) hooks+=(--customize-hook="$2") ;;
      --change) changes+=(--change "$2") ;;
      *) log "unknown option $1"; return 2 ;;
    esac
    shift 2
  done
  local IFS=,
  mmdebstrap --quiet --variant=minbase --include="${includes[*]}" \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-include=/usr/share/locale/locale.alias' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    "${hooks[@]}" "$SUITE" - </dev/null |
    docker import "${changes[@]}" \
      --change "LABEL $STANDIN_LABEL=\"Debian $SUITE stand-in, scripts/standin-images.sh\"" \
      - "$name" >/dev/null
  log "built $name"
}

python_standin() {
  # The host's own CA certificates (/usr/local/share/ca-certificates) join the
  # image's store; Debian's pip reads that store.
  build python:3.11-slim \
    --include python3 --include python3-venv --include passwd --include ca-certificates \
    --hook 'if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
              cp /usr/local/share/ca-certificates/*.crt "$1/usr/local/share/ca-certificates/"
              chroot "$1" update-ca-certificates >/dev/null
            fi' \
    --hook 'chroot "$1" python3 -m venv /usr/local' \
    --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]'
}

redis_standin() {
  build redis:7-alpine \
    --include redis-server \
    --hook 'mkdir -p "$1/data" && chroot "$1" chown redis:redis /data
            cat >"$1/usr/local/bin/docker-entrypoint.sh" <<"EOF"
#!/bin/sh
# As the official redis image: options alone mean redis-server; the server runs as
# the redis user, owns /data, and listens beyond loopback (--protected-mode no)
# unless a config file given first says otherwise.
set -e
if [ "${1#-}" != "$1" ]; then set -- redis-server "$@"; fi
if [ "$1" = redis-server ]; then
  shift
  if [ -f "${1:-}" ]; then
    config=$1
    shift
    if grep -q "^protected-mode" "$config"; then
      set -- "$config" "$@"
    else
      set -- "$config" --protected-mode no "$@"
    fi
  else
    set -- --protected-mode no "$@"
  fi
  set -- redis-server "$@"
  if [ "$(id -u)" = 0 ]; then
    find . \! -user redis -exec chown redis "{}" +
    exec setpriv --reuid=redis --regid=redis --init-groups "$@"
  fi
fi
exec "$@"
EOF
            chmod 755 "$1/usr/local/bin/docker-entrypoint.sh"' \
    --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'WORKDIR /data' \
    --change 'VOLUME /data' \
    --change 'EXPOSE 6379' \
    --change 'ENTRYPOINT ["docker-entrypoint.sh"]' \
    --change 'CMD ["redis-server"]'
}

llama_standin() {
  local binary
  binary=$(bash "$(dirname "$0")/llama-server.sh")
  build ghcr.io/ggml-org/llama.cpp:server \
    --include libgomp1 --include libssl3 --include curl --include ca-certificates \
    --hook "mkdir -p \"\$1/app\" && cp '$binary' \"\$1/app/llama-server\"" \
    --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LLAMA_ARG_HOST=0.0.0.0' \
    --change 'WORKDIR /app' \
    --change 'EXPOSE 8080' \
    --change 'ENTRYPOINT ["/app/llama-server"]'
}

if ! docker info >/dev/null 2>&1; then
  log "no Docker engine reachable (start one: bash scripts/dockerd.sh start)"
  exit 1
fi
for pair in python:3.11-slim=python_standin redis:7-alpine=redis_standin \
  ghcr.io/ggml-org/llama.cpp:server=llama_standin; do
  image=${pair%%=*}
  if present "$image" || pulled "$image"; then
    continue
  fi
  if ! command -v mmdebstrap >/dev/null; then
    log "mmdebstrap is missing (Debian package mmdebstrap; scripts/system-deps.sh installs it)"
    exit 1
  fi
  "${pair#*=}"
done
