"""A real inference server for tests and benchmarks: llama.cpp's ``llama-server`` on a
tiny model with random weights, written here (nothing is downloaded).

The model is a llama-architecture GGUF whose output is built to survive a resume:
its vocabulary holds single characters only (``▁`` and ``a``-``z``, beside the
special and byte tokens a SentencePiece vocabulary needs), so no two tokens merge
and any text the model wrote tokenizes back to exactly the tokens it came from:
prompt + generated text, sent again, continues the same sequence, as llmq's re-run
does. One residual dimension carries a constant (no layer writes to it), and the
output layer weighs it strongly against the special and byte tokens, so greedy
decoding never picks them (they would print nothing, or bytes that do not
round-trip). The logits are scaled up so that greedy choices are far apart and do
not flip with the batch a token was computed in.

``scripts/llama-server.sh`` builds the server binary (CI runs it once; the binary
is cached); :func:`llama_server_binary` finds it and fails, never skips, without it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from llmq.embedded import free_port

ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = ROOT / "scripts" / "llama-server.sh"

#: The characters the model writes: a space (``▁``) and the lowercase letters.
WORD_CHARACTERS = ("▁", *"abcdefghijklmnopqrstuvwxyz")


@dataclass(frozen=True)
class TinyModel:
    """Shape of the random model; the defaults decode a token in about a millisecond."""

    n_embd: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_ff: int = 384
    context_length: int = 4096
    seed: int = 7
    #: Scale of the query and key weights: sharper attention, livelier output.
    attention_scale: float = 4.0
    #: The model's own chat template (None: none; llama-server then uses ChatML).
    chat_template: str | None = None
    #: The model also writes ``é``, as its two byte tokens (:func:`write_tiny_gguf`).
    multibyte: bool = False


def _vocabulary() -> tuple[list[str], list[int]]:
    """``<unk> <s> </s>``, the 256 byte tokens, then the word characters."""
    import gguf

    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *WORD_CHARACTERS]
    kinds = gguf.TokenType
    types = [int(kinds.UNKNOWN), int(kinds.CONTROL), int(kinds.CONTROL)]
    types += [int(kinds.BYTE)] * 256 + [int(kinds.NORMAL)] * len(WORD_CHARACTERS)
    return tokens, types


def write_tiny_gguf(path: Path, shape: TinyModel = TinyModel()) -> Path:
    """Write the random model to ``path`` (a few MB, well under a second)."""
    import gguf

    tokens, types = _vocabulary()
    n_vocab, d, ff = len(tokens), shape.n_embd, shape.n_ff
    rng = np.random.default_rng(shape.seed)

    def weights(*dims: int, scale: float = 1.0) -> np.typing.NDArray[np.float32]:
        drawn: np.typing.NDArray[np.float32] = rng.standard_normal(dims).astype(np.float32)
        return drawn * np.float32(scale / np.sqrt(dims[-1]))

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("llmq-tiny-random")
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(d)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head)
    writer.add_rope_dimension_count(d // shape.n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * n_vocab)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    if shape.chat_template is not None:
        writer.add_chat_template(shape.chat_template)

    # Dimension 0 of the residual stream: a constant 4 from every embedding, which
    # no layer changes (rows 0 of attn_output and ffn_down are zero).
    embedding = rng.standard_normal((n_vocab, d)).astype(np.float32)
    embedding[:, 0] = 4.0
    output = weights(n_vocab, d, scale=40.0)
    output[:, 0] = 0.0
    first_word = n_vocab - len(WORD_CHARACTERS)
    output[:first_word, 0] = -1000.0  # special and byte tokens: never the greedy choice
    if shape.multibyte:
        _write_multibyte(embedding, output, tokens)
    clean = (0, 1) if shape.multibyte else (0,)  # residual dimensions no layer writes
    writer.add_tensor("token_embd.weight", embedding)
    writer.add_tensor("output_norm.weight", np.ones(d, dtype=np.float32))
    writer.add_tensor("output.weight", output)
    for layer in range(shape.n_layer):
        name = f"blk.{layer}."
        attn_output, ffn_down = weights(d, d), weights(d, ff)
        attn_output[clean, :] = 0.0
        ffn_down[clean, :] = 0.0
        writer.add_tensor(name + "attn_norm.weight", np.ones(d, dtype=np.float32))
        writer.add_tensor(name + "attn_q.weight", weights(d, d, scale=shape.attention_scale))
        writer.add_tensor(name + "attn_k.weight", weights(d, d, scale=shape.attention_scale))
        writer.add_tensor(name + "attn_v.weight", weights(d, d))
        writer.add_tensor(name + "attn_output.weight", attn_output)
        writer.add_tensor(name + "ffn_norm.weight", np.ones(d, dtype=np.float32))
        writer.add_tensor(name + "ffn_gate.weight", weights(ff, d))
        writer.add_tensor(name + "ffn_up.weight", weights(ff, d))
        writer.add_tensor(name + "ffn_down.weight", ffn_down)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _write_multibyte(
    embedding: np.typing.NDArray[np.float32],
    output: np.typing.NDArray[np.float32],
    tokens: list[str],
) -> None:
    """Let the model write ``é`` (UTF-8 ``C3 A9``) as two byte tokens, so that
    llama-server holds the first back and sends both in one chunk: ``<0xC3>`` competes
    with the letters, and after it ``<0xA9>`` always wins. Residual dimension 1 (which
    no layer writes to) is 4 only at a ``<0xC3>``, and the output layer weighs it
    strongly for ``<0xA9>``. The text round-trips: llama.cpp tokenizes an ``é`` back
    into the same two byte tokens (the vocabulary has no ``é``)."""
    lead, tail = tokens.index("<0xC3>"), tokens.index("<0xA9>")
    embedding[:, 1] = 0.0
    embedding[lead, 1] = 4.0
    output[:, 1] = 0.0
    output[lead, 0] = 0.0  # a letter among the letters
    output[tail, 1] = 2000.0


#: A chat template that takes tools, in Functionary v3.2's format (llama-server knows it
#: by its ``>>>all`` and ``>>>${recipient}``): an answer opens with its recipient after
#: ``>>>``, ``all`` for text or a function's name for a call, then a newline and the text
#: or the call's JSON arguments. The model itself has no template (llama-server then
#: uses plain ChatML, which takes no tools); with this one the server describes the
#: tools to the model, parses its calls, and constrains them by grammar.
TOOLS_CHAT_TEMPLATE = """\
{{- '<|start_header_id|>system<|end_header_id|>\\n\\nAnswer as >>>${recipient}\\n${content}, '
    + 'the recipient all or a function.\\nFunctions:' }}
{%- for tool in tools or [] %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '<|eot_id|>' }}
{%- for message in messages %}
{%- if message.role != 'assistant' %}
{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content }}
{{- '<|eot_id|>' }}
{%- else %}
{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- if message.content %}{{- '>>>all\\n' + message.content }}{%- endif %}
{%- for call in message.tool_calls or [] %}
{{- '>>>' + call.function.name + '\\n' + call.function.arguments }}
{%- endfor %}
{{- '<|eot_id|>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n>>>' }}
{%- endif %}
"""


class LlamaServerMissing(RuntimeError):
    """No ``llama-server`` binary: run ``scripts/llama-server.sh`` (CI does)."""


def llama_server_binary() -> Path:
    """``$LLMQ_LLAMA_SERVER``, else the cached build of ``scripts/llama-server.sh``, else
    one on ``PATH``."""
    explicit = os.environ.get("LLMQ_LLAMA_SERVER")
    if explicit:
        return Path(explicit)
    cache = Path(os.environ.get("LLMQ_CACHE", Path.home() / ".cache" / "llmq"))
    built = sorted(cache.glob("llama-server-*/llama-server"))
    if built:
        return built[-1]
    found = shutil.which("llama-server")
    if found:
        return Path(found)
    raise LlamaServerMissing(
        f"no llama-server: build it with {BUILD_SCRIPT} (cached under {cache}) "
        "or set LLMQ_LLAMA_SERVER"
    )


def llama_server_argv(
    model: Path,
    port: int,
    *,
    slots: int = 2,
    context: int = 4096,
    threads: int = 1,
    token_by_token: bool = False,
    chat_template: Path | None = None,
) -> list[str]:
    """How the tests and the benchmark run the server: ``slots`` parallel sequences
    sharing ``context`` tokens (so each slot holds ``context / slots``), on loopback,
    with ``/slots`` and ``/metrics`` on.

    ``token_by_token``: micro-batches of one token, so that a prompt is prefilled by
    the same computation that decodes (and a sequence never shares a batch): a
    resumed run's prefill of prompt + generated text then yields exactly the logits
    the uninterrupted run had. With batched prefill the sums are ordered differently
    and a near-tie of the random model can flip (measured: a 600-token run resumed
    anywhere diverged at the same few positions).

    ``chat_template``: a file with the chat template to use instead of the model's
    (:data:`TOOLS_CHAT_TEMPLATE`, for tools).
    """
    argv = [
        str(llama_server_binary()),
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--parallel",
        str(slots),
        "--ctx-size",
        str(context),
        "--threads",
        str(threads),
        "--threads-batch",
        str(threads),
        "--slots",
        "--metrics",
        "--no-webui",
    ]
    if token_by_token:
        argv += ["--ubatch-size", "1"]
    if chat_template is not None:
        argv += ["--chat-template-file", str(chat_template)]
    return argv


def wait_ready(
    url: str,
    process: subprocess.Popen[bytes] | None,
    timeout: float = 60.0,
    name: str = "llama-server",
) -> None:
    """Until the server's ``/health`` says ok (the model is loaded); ``name`` for errors."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode} before ready")
        try:
            if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{name} at {url} not ready after {timeout}s")


@contextmanager
def tiny_server(slots: int) -> Iterator[str]:
    """A server on the default tiny model with ``slots`` slots of 1024 tokens each, on a
    free port, until the block ends; its URL. For the benchmarks' own comparisons."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        model = write_tiny_gguf(Path(tmp) / "tiny.gguf")
        argv = llama_server_argv(model, port, slots=slots, context=slots * 1024)
        server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready(url, server)
            yield url
        finally:
            server.kill()
            server.wait()


def served_model(url: str) -> dict[str, Any]:
    """What the server says of the model it loaded (``/v1/models``' ``meta``: its width
    ``n_embd``, ``n_params``, ``size`` in bytes, ...)."""
    models = httpx.get(url + "/v1/models", timeout=5.0).json()["data"]
    meta: dict[str, Any] = models[0]["meta"]
    return meta


def decode_totals(url: str) -> tuple[float, float]:
    """Tokens the server has generated and decode steps it has run since it started
    (``/metrics``: ``tokens_predicted_total``, ``n_decode_total``). Over a run, the
    first's growth over the second's is how many sequences a step decoded: the width of
    its batches, which its CPU per token falls with."""
    totals = dict.fromkeys(("llamacpp:tokens_predicted_total", "llamacpp:n_decode_total"), 0.0)
    for line in httpx.get(url + "/metrics", timeout=5.0).text.splitlines():
        name, _, value = line.partition(" ")
        if name in totals:
            totals[name] = float(value)
    return totals["llamacpp:tokens_predicted_total"], totals["llamacpp:n_decode_total"]


def busy_slots(url: str) -> int:
    """How many of the server's slots are processing a sequence (``/slots``)."""
    slots = httpx.get(url + "/slots", timeout=5.0).json()
    return sum(1 for slot in slots if slot.get("is_processing"))
