# One image for every llmq server process; the command picks the role (llmq api |
# worker | autoscale). The load generator and benchmarks (the loadgen extra) are not in it.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY llmq ./llmq
COPY api ./api
COPY worker ./worker
COPY cli ./cli
RUN pip install . && useradd --system --uid 10001 llmq

USER llmq
EXPOSE 8000
CMD ["llmq", "api"]
