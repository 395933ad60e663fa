"""One version everywhere: pyproject.toml states it, CHANGELOG.md's newest release is it, and the package,
``minidist --version`` and ``minidist info`` report it.

``python -m minidist info`` is the same command under another name.

A release bumps pyproject.toml's ``version`` and moves CHANGELOG.md's ``[Unreleased]`` entries under a new
``## [X.Y.Z] - YYYY-MM-DD`` heading; this test fails until both are done. The command runs as
``python -m minidist_cli`` (the console script's own ``main``), so the test does not depend on PATH.
"""

from __future__ import annotations

import re
import subprocess
import sys

from mpi_utils import REPO, mpi_env

import minidist

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the tomli dependency
    import tomli as tomllib

RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", re.MULTILINE)


def minidist_command(*args: str, module: str = "minidist_cli") -> str:
    result = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        env=mpi_env(),  # this checkout's minidist first on the path, whatever is installed
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_one_version_in_pyproject_changelog_package_and_command():
    stated = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]

    changelog = (REPO / "CHANGELOG.md").read_text()
    releases = RELEASE.findall(changelog)
    assert releases, "CHANGELOG.md has no '## [X.Y.Z] - YYYY-MM-DD' heading"
    assert changelog.index("## [Unreleased]") < changelog.index(f"## [{releases[0][0]}]"), (
        "CHANGELOG.md keeps '## [Unreleased]' above the newest release"
    )
    newest = releases[0][0]

    info = re.search(r"^minidist\s+(\S+)$", minidist_command("info"), re.MULTILINE)
    assert info, "`minidist info` prints no 'minidist <version>' line"

    versions = {
        "pyproject.toml": stated,
        "CHANGELOG.md's newest release": newest,
        f"minidist.__version__ ({minidist.__file__})": minidist.__version__,
        "minidist --version": minidist_command("--version").strip().removeprefix("minidist "),
        "minidist info": info.group(1),
        "python -m minidist info": re.search(
            r"^minidist\s+(\S+)$", minidist_command("info", module="minidist"), re.MULTILINE
        ).group(1),
    }
    assert len(set(versions.values())) == 1, f"the version differs: {versions}"
