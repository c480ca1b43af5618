"""Layers point one way: the shared contract (``llmq``) imports nothing above it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Packages that sit above the contract: they import it, never the other way.
ABOVE = ("api", "worker", "loadgen", "cli", "bench", "tests")


#: The protocol's modules that hold its encodings and its scripts: a caller that
#: imports them builds values or runs scripts of the protocol itself.
PIECES = ("llmq.protocol.codec", "llmq.protocol.scripts")

#: The only module outside the protocol package that does: the worker registry
#: (``worker_beat.lua``), not a step of the claim path. The publisher sends the
#: calls that :func:`llmq.protocol.streams.publish_calls` builds.
ASSEMBLERS = {"llmq/registry.py"}


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
