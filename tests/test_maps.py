"""The API's and the worker's package docstrings are maps that stay true.

Each package's ``__init__`` walks a request through it (as :mod:`llmq.protocol`
walks the queue), naming every module of the package as ````name.py````. A module
added without a place on the map, or a map naming a module that is gone, fails
here, so a newcomer who reads the map reads the package as it is.

A subpackage may keep its own map: the parent names it as ````name/```` and the
subpackage's ``__init__`` names its modules.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: ````routes/openai.py````, ````engine/````: how a map names a module or a subpackage.
NAMED = re.compile(r"``([\w/]+(?:\.py|/))``")


def map_of(package: Path) -> str:
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text()))
    return doc or ""


def unmapped(package: Path) -> list[str]:
    """The modules under ``package`` that its map (or a mapped subpackage's) leaves out."""
    named = set(NAMED.findall(map_of(package)))
    missing = []
    for module in sorted(package.rglob("*.py")):
        rel = module.relative_to(package)
        if module.name == "__init__.py" or rel.as_posix() in named:
            continue
        sub = package / rel.parts[0]
        if len(rel.parts) > 1 and f"{rel.parts[0]}/" in named:
            if module.relative_to(sub).as_posix() in unmapped(sub):
                missing.append(rel.as_posix())
            continue
        missing.append(rel.as_posix())
    return missing


def stale(package: Path) -> list[str]:
    """What the map names that is not there."""
    return [n for n in NAMED.findall(map_of(package)) if not (package / n).exists()]


@pytest.mark.parametrize("name", ["api", "worker"])
def test_every_module_is_on_its_packages_map(name: str) -> None:
    assert unmapped(ROOT / name) == []


@pytest.mark.parametrize("name", ["api", "worker"])
def test_the_map_names_only_modules_that_exist(name: str) -> None:
    assert stale(ROOT / name) == []


def test_the_check_finds_a_module_left_off_the_map_and_a_name_with_no_module(
    tmp_path: Path,
) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""``a.py`` then ``sub/`` then ``gone.py``."""\n')
    for module in ("a.py", "b.py", "sub/c.py", "sub/d.py"):
        (pkg / module).write_text("")
    (pkg / "sub" / "__init__.py").write_text('"""``c.py``."""\n')
    assert unmapped(pkg) == ["b.py", "sub/d.py"]
    assert stale(pkg) == ["gone.py"]
    (pkg / "sub" / "__init__.py").write_text('"""``c.py``, ``d.py``."""\n')
    assert unmapped(pkg) == ["b.py"]
