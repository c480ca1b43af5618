# One image for every llmq server process; the command picks the role (llmq api |
# worker | autoscale). The load generator and benchmarks (the loadgen extra) are not in it.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# Dependencies first, read from pyproject.toml: a change to the code alone rebuilds
# only the last layers, not every dependency.
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt "setuptools>=68" wheel \
    && rm /tmp/requirements.txt \
    && useradd --system --uid 10001 llmq

COPY llmq ./llmq
COPY api ./api
COPY worker ./worker
COPY cli ./cli
RUN pip install --no-deps --no-build-isolation . && rm -rf build ./*.egg-info && llmq --help >/dev/null

USER llmq
EXPOSE 8000
CMD ["llmq", "api"]
