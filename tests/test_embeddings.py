"""``POST /v1/embeddings`` through the queue, with the openai SDK and LangChain's
``OpenAIEmbeddings`` unmodified: deterministic unit vectors per input and seed,
``dimensions``, ``encoding_format: base64``, lists of inputs; refused (400
``unsupported_parameter``) when the serving workers do not declare ``embeddings``.
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import AsyncIterator, Sequence
from typing import Any

import openai
import pytest
from langchain_openai import OpenAIEmbeddings
from pydantic import SecretStr
from redis.asyncio import Redis

from llmq.model.interface import CAPABILITIES
from llmq.protocol import keys
from llmq.protocol.streams import lifecycle_entries
from tests.support.native import wait_ready
from tests.support.servers import RunningApi, StartApi, StartWorker
from worker.embedding import embed_text
from worker.mock import MockBackend


@pytest.fixture
async def client(fast: RunningApi) -> AsyncIterator[openai.AsyncOpenAI]:
    async with fast.sdk() as sdk:
        yield sdk


async def queued_ids(redis: Redis) -> list[str]:
    """The ids of the requests queued so far."""
    entries = await lifecycle_entries(redis)
    return [fields["request_id"] for _, fields in entries if fields["event"] == "queued"]


def norm(vector: list[float]) -> float:
    return math.sqrt(sum(v * v for v in vector))


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / (norm(a) * norm(b))


async def test_vectors_are_deterministic_unit_vectors(client: openai.AsyncOpenAI) -> None:
    texts = ["the cat sat on the mat", "a cat on a mat", "stock prices fell sharply"]
    first = await client.embeddings.create(model="mock", input=texts)
    again = await client.embeddings.create(model="mock", input=texts[0])
    assert first.object == "list" and first.model == "mock"
    assert [d.index for d in first.data] == [0, 1, 2]
    vectors = [d.embedding for d in first.data]
    assert all(len(v) == 1536 for v in vectors)  # the worker's default size
    assert all(abs(norm(v) - 1) < 1e-5 for v in vectors)
    assert again.data[0].embedding == vectors[0]
    # Texts that share words are closer than texts that do not.
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2])
    assert first.usage.prompt_tokens == sum(len(t.split()) for t in texts)
    assert first.usage.total_tokens == first.usage.prompt_tokens


async def test_dimensions_and_seed(client: openai.AsyncOpenAI) -> None:
    short = await client.embeddings.create(model="mock", input="hello world", dimensions=64)
    (vector,) = [d.embedding for d in short.data]
    assert len(vector) == 64 and abs(norm(vector) - 1) < 1e-5
    expected = embed_text("hello world", 64)
    assert vector == pytest.approx(expected, abs=1e-6)
    seeded = await client.embeddings.create(
        model="mock", input="hello world", dimensions=64, extra_body={"seed": 5}
    )
    assert seeded.data[0].embedding != pytest.approx(vector, abs=1e-3)
    assert seeded.data[0].embedding == pytest.approx(embed_text("hello world", 64, 5), abs=1e-6)


async def test_base64_and_float_encodings(fast: RunningApi) -> None:
    body: dict[str, Any] = {"model": "mock", "input": ["one two", "three"], "dimensions": 8}
    async with fast.client() as http:
        plain = (await http.post("/v1/embeddings", json=body)).json()
        packed = await http.post("/v1/embeddings", json=body | {"encoding_format": "base64"})
    for as_float, as_base64 in zip(plain["data"], packed.json()["data"], strict=True):
        raw = base64.b64decode(as_base64["embedding"])
        assert list(struct.unpack("<8f", raw)) == as_float["embedding"]


async def test_token_id_inputs(fast: RunningApi) -> None:
    async with fast.client() as http:
        reply = await http.post("/v1/embeddings", json={"model": "mock", "input": [[1, 2], [3]]})
    assert reply.status_code == 200, reply.text
    assert [len(d["embedding"]) for d in reply.json()["data"]] == [1536, 1536]


async def test_many_inputs_in_one_job(client: openai.AsyncOpenAI, redis: Redis) -> None:
    """A list of inputs is one request in the queue, its vectors over several events."""
    texts = [f"document number {i}" for i in range(150)]
    result = await client.embeddings.create(model="mock", input=texts, dimensions=16)
    assert len(result.data) == 150
    assert result.data[149].embedding == pytest.approx(embed_text(texts[149], 16), abs=1e-6)
    assert len(await queued_ids(redis)) == 1


async def test_langchain_openai_embeddings(fast: RunningApi) -> None:
    async with openai.DefaultAsyncHttpxClient() as http:
        embeddings = OpenAIEmbeddings(
            openai_api_base=fast.url + "/v1",
            openai_api_key=SecretStr("unused"),
            model="mock",
            dimensions=32,
            # Without tiktoken's vocabulary (a download), send texts as they are.
            check_embedding_ctx_length=False,
            max_retries=0,
            http_async_client=http,
        )
        documents = await embeddings.aembed_documents(["alpha beta", "gamma delta", "alpha"])
        query = await embeddings.aembed_query("alpha beta")
    assert len(documents) == 3 and all(len(v) == 32 for v in documents)
    assert query == pytest.approx(documents[0], abs=1e-6)
    assert query == pytest.approx(embed_text("alpha beta", 32), abs=1e-6)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": ["fine", " "]}, "input[1]"),
        ({"input": []}, "input"),
        ({"dimensions": 0}, "dimensions"),
        ({"dimensions": 100_000}, "dimensions"),
        ({"encoding_format": "int8"}, "encoding_format"),
    ],
)
async def test_bad_input_gets_openai_errors(
    fast: RunningApi, fields: dict[str, Any], param: str
) -> None:
    async with fast.client() as http:
        reply = await http.post("/v1/embeddings", json={"model": "mock", "input": "hi", **fields})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


async def test_an_empty_input_list_is_refused_in_its_own_words(fast: RunningApi) -> None:
    async with fast.client() as http:
        reply = await http.post("/v1/embeddings", json={"model": "mock", "input": []})
    assert reply.status_code == 400
    assert reply.json()["error"]["message"] == "input: must hold at least one text"


async def test_refused_without_the_capability(
    start_api: StartApi, start_worker: StartWorker
) -> None:
    """Switched off (a model that does not declare embeddings): refused, never faked."""
    await start_worker(backend=MockBackend(capabilities=CAPABILITIES - {"embeddings"}))
    api = await start_api()
    async with api.client() as http:
        await wait_ready(http)
        reply = await http.post("/v1/embeddings", json={"model": "mock", "input": "hi"})
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "unsupported_parameter"
    assert reply.json()["error"]["param"] == "input"


async def test_vectors_travel_on_the_request_stream_and_leave_it_once_read(
    client: openai.AsyncOpenAI, redis: Redis
) -> None:
    texts = [f"text {i}" for i in range(100)]  # two embedding events
    await client.embeddings.create(model="mock", input=texts, dimensions=4)
    (rid,) = await queued_ids(redis)
    info = await redis.xinfo_stream(keys.stream(rid))
    assert info["entries-added"] == 4  # started, two embedding events, done
    entries = await redis.xrange(keys.stream(rid))
    assert [fields["type"] for _, fields in entries] == ["started", "done"]


class FailingEmbedder(MockBackend):
    """The mock, with an embedder that raises."""

    async def embed(
        self, texts: Sequence[str], dimensions: int | None, seed: int
    ) -> list[list[float]]:
        raise RuntimeError("no vectors today")


async def test_an_embedder_that_fails_is_a_server_error(
    start_api: StartApi, start_worker: StartWorker
) -> None:
    await start_worker(backend=FailingEmbedder())
    api = await start_api()
    async with api.client() as http:
        await wait_ready(http)
        reply = await http.post("/v1/embeddings", json={"model": "mock", "input": "hi"})
    assert reply.status_code == 500
    error = reply.json()["error"]
    assert error["code"] == "model_error" and "no vectors today" in error["message"]


def test_a_shorter_vector_is_the_start_of_the_longer_one() -> None:
    full, short = embed_text("a b c a", 128), embed_text("a b c a", 16)
    head = full[:16]
    assert short == pytest.approx([v / norm(head) for v in head], abs=1e-12)
