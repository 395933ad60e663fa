"""The ``minidist`` command: one entry point whose help lists every tool, each with a ``--help`` of its own.

Run as ``python -m minidist_cli`` (the same ``main`` as the console script ``minidist`` that
``pip install`` puts on PATH), so the test does not depend on PATH.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from mpi_utils import REPO, mpi_env

import minidist as md
from minidist_cli import COMMANDS, LIBRARIES


def minidist(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "minidist_cli", *args],
        capture_output=True,
        text=True,
        env=mpi_env(),
        timeout=60,
    )


def test_help_lists_every_command_and_library_tool():
    result = minidist("--help")
    assert result.returncode == 0, result.stderr
    for name in [*COMMANDS, *LIBRARIES, "copy_lessons.py"]:
        assert name in result.stdout, name
    # every subpackage of minidist_tools is reached from the help: as a command or as a library
    tools = {p.name for p in (REPO / "minidist_tools").iterdir() if (p / "__init__.py").exists()}
    for tool in tools:
        assert (
            f"minidist {tool}" in f"minidist {' minidist '.join(COMMANDS)}"
            or f"minidist_tools.{tool}" in (result.stdout)
        ), f"minidist --help does not mention the tool {tool}"


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_has_a_help_of_its_own(command):
    result = minidist(command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: minidist {command}"), result.stdout[:200]


def test_an_unknown_or_missing_command_is_an_error_that_lists_the_commands():
    for args in (["bogus"], []):
        result = minidist(*args)
        assert result.returncode == 2
        assert "minidist: error:" in result.stderr and "checkpoint, cluster" in result.stderr, result.stderr
        assert result.stdout == ""


def test_python_m_minidist_is_the_command_under_another_name():
    def run(*args):
        cmd = [sys.executable, "-m", "minidist", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)

    bare = run()
    assert bare.returncode == 2 and "checkpoint, cluster" in bare.stderr, bare.stderr
    info = run("info")
    assert info.returncode == 0, info.stderr
    assert info.stdout.splitlines()[0].split() == ["minidist", md.__version__], info.stdout
