#!/usr/bin/env bash
# Builds llama.cpp's C++ `llama-server` (the inference server the upstream tests and the
# `upstream` benchmark run) and caches the binary under ~/.cache/llmq/, keyed by version.
#
# The source is the llama.cpp tree vendored in the llama-cpp-python sdist on PyPI (the only
# package registry the test machines reach). CPU only, portable (no -march=native, so a cache
# moved between machines still runs), static, no libcurl. A cold build takes ~11 CPU-minutes
# (~6 min on 2 idle cores; 28 min measured on a 2-core machine shared with other builds);
# a cached one returns at once. Prints the binary's path.
#
#   LLAMA_CPP_PYTHON_VERSION  the sdist to build from (default below)
#   LLMQ_CACHE                cache root (default ~/.cache/llmq)
set -euo pipefail

version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
cache="${LLMQ_CACHE:-$HOME/.cache/llmq}"
dest="$cache/llama-server-$version"
binary="$dest/llama-server"

if [[ -x "$binary" ]]; then
    echo "$binary"
    exit 0
fi

python="${PYTHON:-python3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$python" -m pip download -q --no-deps --no-binary llama-cpp-python -d "$work" "llama-cpp-python==$version" >&2
tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
src="$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)"

cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >&2
cmake --build "$work/build" --target llama-server -j "$(nproc)" >&2

mkdir -p "$dest"
cp "$work/build/bin/llama-server" "$binary.tmp"
mv "$binary.tmp" "$binary"
echo "$binary"
