"""The ``llmq`` command: every setting is a flag and an LLMQ_* variable."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import REUSE_PORT, SETTINGS, build_parser, build_settings, main, settings_flags
from llmq.policy.model import Policy
from llmq.settings import ApiSettings, RunSettings, WorkerSettings


@pytest.mark.parametrize("command", sorted(SETTINGS))
def test_every_setting_is_a_flag(command: str) -> None:
    cls = SETTINGS[command]
    parser = build_parser()
    for name in cls.model_fields:
        args = parser.parse_args([command])
        assert hasattr(args, name), f"{command} lacks --{name.replace('_', '-')}"


@pytest.mark.parametrize("command", sorted(SETTINGS))
def test_every_setting_is_documented_in_the_settings_page(command: str) -> None:
    page = (Path(__file__).resolve().parent.parent / "docs" / "settings.md").read_text()
    missing = [
        f"LLMQ_{name.upper()}"
        for name in SETTINGS[command].model_fields
        if f"`LLMQ_{name.upper()}`" not in page
    ]
    assert not missing, f"docs/settings.md does not document {missing}"


def test_the_pool_policy_table_holds_exactly_the_policys_keys() -> None:
    """docs/settings.md: one table of the pool policy's keys (the Policy model's fields),
    and no policy key among the process settings' tables."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "settings.md").read_text()
    policy, process = page.split("## Pool policy", 1)[1].split("## Process settings", 1)
    keys = [line.split("`")[1] for line in policy.splitlines() if line.startswith("| `")]
    assert keys == list(Policy.model_fields)
    listed = {line.split("`")[1] for line in process.splitlines() if line.startswith("| `")}
    assert not {f"LLMQ_{k.upper()}" for k in keys} & listed


def test_flag_beats_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMQ_PORT", "9001")
    monkeypatch.setenv("LLMQ_CONCURRENCY", "3")
    args = build_parser().parse_args(["run", "--port", "9002", "--workers", "4"])
    settings = build_settings(RunSettings, args)
    assert (settings.port, settings.workers, settings.concurrency) == (9002, 4, 3)


def test_environment_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMQ_MODEL_TOKENS_PER_SECOND", "123.5")
    monkeypatch.setenv("LLMQ_LOG_JSON", "true")
    worker = build_settings(WorkerSettings, build_parser().parse_args(["worker"]))
    assert worker.model_tokens_per_second == 123.5 and worker.log_json
    api = build_settings(ApiSettings, build_parser().parse_args(["api", "--no-log-json"]))
    assert api.log_json is False


def test_invalid_setting_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker", "--concurrency", "0"]) == 2
    assert "invalid setting concurrency" in capsys.readouterr().err


def test_help_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cli", "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0
    for command in ("api", "worker", "run", "loadgen"):
        assert command in out.stdout


@pytest.mark.parametrize("command", sorted(SETTINGS))
def test_each_commands_help_shows_its_settings(command: str) -> None:
    """``llmq <command> --help`` lists every flag, descriptions with a % sign included."""
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    text = subparsers.choices[command].format_help()
    for name in SETTINGS[command].model_fields:
        assert f"--{name.replace('_', '-')}" in text


def test_an_api_process_of_several_builds_its_parents_settings() -> None:
    """``llmq api --api-processes N`` hands its own flags to each child it starts."""
    parser = build_parser()
    args = parser.parse_args(["api", "--port", "9003", "--no-log-json", "--api-processes", "3"])
    child = parser.parse_args(["api", REUSE_PORT, *settings_flags(ApiSettings, args)])
    assert child.reuse_port and not args.reuse_port
    assert build_settings(ApiSettings, child) == build_settings(ApiSettings, args)


#: A server-only install, simulated: the ``loadgen`` extra's packages cannot be imported.
WITHOUT_LOADGEN_EXTRA = """
import sys
from importlib.abc import MetaPathFinder

EXTRA = {"rich", "matplotlib", "numpy"}

class Missing(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in EXTRA:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Missing())
from cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["loadgen"],
        ["loadgen", "--base-url", "http://127.0.0.1:9", "--duration", "3"],
        ["loadgen", "--help"],
    ],
)
def test_loadgen_without_its_extra_says_how_to_install_it(argv: list[str]) -> None:
    """Whatever the arguments, a server-only install answers with the install hint,
    not argparse's "unrecognized arguments" for flags it does not know there."""
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_LOADGEN_EXTRA, *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert "pip install 'llmq[loadgen]'" in out.stderr
    assert "unrecognized arguments" not in out.stderr
