"""A server install carries only what serving needs: the load generator is an extra."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
#: What only the load generator and the benchmarks use.
LOADGEN_ONLY = ("rich", "matplotlib", "numpy")


def test_the_load_generators_dependencies_are_an_extra_not_the_servers() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [
        d.split("[")[0].split(">")[0].split("=")[0].split("<")[0] for d in project["dependencies"]
    ]
    assert not set(LOADGEN_ONLY) & set(names)
    extra = {d.split(">")[0] for d in project["optional-dependencies"]["loadgen"]}
    assert set(LOADGEN_ONLY) <= extra


def test_serving_imports_none_of_the_load_generators_dependencies() -> None:
    # httpx's optional command line (httpx[cli]) imports rich when it is installed,
    # as the dev extra's packages do; the server never runs it, so the probe blocks it.
    probe = (
        "import sys; sys.modules['httpx._main'] = None\n"
        "import api.app, api.main, worker.main, cli.main\n"
        f"print(','.join(m for m in {LOADGEN_ONLY!r} if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_the_image_installs_only_the_server() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY loadgen" not in dockerfile
    installs = re.search(r"pip install (--[\w-]+ )*\.(\s|$)", dockerfile)
    assert installs, "the image installs the plain package"
