"""``python -m minidist`` points to the ``minidist`` command, where the tools around the framework live."""

import sys

print(
    "minidist's tools are the `minidist` command (also `python -m minidist_cli`): "
    "run `minidist --help` to list them",
    file=sys.stderr,
)
sys.exit(2)
