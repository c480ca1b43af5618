"""Layers point one way.

``llmq`` (the contract: settings, schema, protocol, the model's declaration)
<- ``api`` and ``worker`` (neither imports the other) <- ``loadgen``, ``cli``
<- ``bench``; ``rigs`` (test and benchmark hosts) sits beside ``bench`` and only
``tests`` and ``bench`` may use it. Inside ``api``, admission and the streams sit
below the routes, batches and the Responses API.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Packages that sit above the contract: they import it, never the other way.
ABOVE = ("api", "worker", "loadgen", "cli", "bench", "rigs", "tests")

#: For each top-level package, the packages it must never import.
NEVER = {
    "llmq": set(ABOVE),
    "api": {"worker", "loadgen", "cli", "bench", "rigs", "tests"},
    "worker": {"api", "loadgen", "cli", "bench", "rigs", "tests"},
    "loadgen": {"api", "cli", "bench", "rigs", "tests"},
    "cli": {"bench", "rigs", "tests"},
    "rigs": {"api", "worker", "loadgen", "cli", "bench", "tests"},
    "bench": {"tests"},
}

#: What ``pip install .`` and the image ship: the server and its tools, no rigs.
SHIPPED = {"llmq", "api", "worker", "loadgen", "cli"}


#: The protocol's modules that hold its encodings and its scripts: a caller that
#: imports them builds values or runs scripts of the protocol itself.
PIECES = ("llmq.protocol.codec", "llmq.protocol.scripts")

#: The only modules outside the protocol package that do, neither a step of the claim
#: path: the worker registry (``worker_beat.lua``) and the metrics flush
#: (``metrics_flush.lua``). The publisher sends the calls that
#: :func:`llmq.protocol.streams.publish_calls` builds.
ASSEMBLERS = {"llmq/registry.py", "llmq/metrics.py"}


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports; for ``from a import b``, both ``a`` and ``a.b``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_shared_contract_imports_nothing_above_it() -> None:
    upward = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in (ROOT / "llmq").rglob("*.py")
        for name in imported(path)
        if name.split(".")[0] in ABOVE
    }
    assert not upward, sorted(upward)


def test_every_layer_imports_only_what_lies_below_it() -> None:
    wrong = {
        f"{path.relative_to(ROOT)}: {name}"
        for top, never in NEVER.items()
        for path in (ROOT / top).rglob("*.py")
        for name in imported(path)
        if name.split(".")[0] in never
    }
    assert not wrong, sorted(wrong)


#: Within ``api/``, grouped by concern: what each concern never imports. Admission
#: (auth to enqueue) sits below everything that serves a request; the streams below
#: the routes and the surfaces built on them (batches, Responses).
API_NEVER = {
    "admission": {"api.routes", "api.batch", "api.responses", "api.streams"},
    "streams": {"api.routes", "api.batch", "api.responses"},
}


def test_the_api_concerns_point_one_way() -> None:
    wrong = {
        f"{path.relative_to(ROOT)}: {name}"
        for concern, never in API_NEVER.items()
        for path in (ROOT / "api" / concern).rglob("*.py")
        for name in imported(path)
        if any(name == n or name.startswith(f"{n}.") for n in never)
    }
    assert not wrong, sorted(wrong)


def test_the_rigs_are_not_shipped() -> None:
    """The server package and the image hold the server only."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    include = pyproject.split("[tool.setuptools.packages.find]", 1)[1].split("\n\n", 1)[0]
    shipped = {name.strip('"* ') for name in include.split("[", 1)[1].split("]", 1)[0].split(",")}
    assert shipped == SHIPPED
    copied = {
        line.split()[1]
        for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ") and not line.split()[1].endswith((".toml", ".md"))
    }
    assert "rigs" not in copied and "bench" not in copied and "tests" not in copied


def test_the_shell_and_the_supervisor_sit_above_what_they_start() -> None:
    shell = imported(ROOT / "cli" / "main.py")
    assert {"api.main", "worker.main"} <= shell
    assert (ROOT / "cli" / "supervisor.py").exists()
    assert not (ROOT / "llmq" / "cli.py").exists()


def test_the_api_and_the_worker_call_the_protocol_rather_than_assemble_it() -> None:
    """The claim path stays in ``llmq/protocol/``: outside it, nothing but the
    registry encodes the values Lua reads or runs a script."""
    assembling = {
        str(path.relative_to(ROOT))
        for top in ("api", "worker", "cli", "loadgen", "bench", "llmq")
        for path in (ROOT / top).rglob("*.py")
        if "protocol" not in path.relative_to(ROOT).parts and imported(path) & set(PIECES)
    }
    assert assembling == ASSEMBLERS
