"""A compose file as ``docker-compose config`` resolves it (Debian's docker-compose)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

#: Tests that need the ``docker-compose`` command; .ci/run installs it.
needs_docker_compose = pytest.mark.skipif(
    shutil.which("docker-compose") is None,
    reason="docker-compose is not installed (Debian package docker-compose; .ci/run installs it)",
)


def resolved(compose: Path) -> dict[str, Any]:
    """The file after ``docker-compose config`` validated and resolved it."""
    result = subprocess.run(
        ["docker-compose", "-f", str(compose), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=compose.parent,
    )
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = yaml.safe_load(result.stdout)
    return config
