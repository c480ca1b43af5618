"""Test and benchmark rigs: hosts in network namespaces, a local Redis Cluster, real
inference servers on tiny random models (llama.cpp's, vLLM's).

Only ``tests/`` and ``bench/`` use them; they are not part of the server package
(``pyproject.toml`` does not ship them and the image does not copy them).
"""
