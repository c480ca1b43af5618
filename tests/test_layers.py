"""Layers point one way: the shared contract (``llmq``) imports nothing above it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Packages that sit above the contract: they import it, never the other way.
ABOVE = ("api", "worker", "loadgen", "cli", "bench", "tests")


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
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
