"""Where in the user's program a collective was called: the ``train.py:42`` of debug mode's fingerprints.

Debug mode (``debug.py``) compares every rank's call of a collective. Two same-shape ``all_reduce`` calls
issued in a different order on two ranks (``loss`` then ``acc`` on rank 0, the other way round on rank 1)
look identical by their arguments; what differs is the line of the program that made them. So the
fingerprint includes that line: the first frame of the call stack outside minidist itself and outside
the standard library (``contextlib``'s ``with`` blocks, the ``threading`` machinery of DDP's
communication thread), which is the user's line that started the call.
"""

from __future__ import annotations

import os
import sys
import sysconfig

# Frames in these folders are not "the user's code": minidist itself, and the standard library
# (contextlib's `with`, threading's run() of DDP's communication thread).
_NOT_USER = tuple(
    os.path.join(folder, "")  # with a trailing separator: "minidist_tools/" is the user's
    for folder in (
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        sysconfig.get_paths()["stdlib"],
    )
)


def call_site() -> str:
    """``"train.py:42"``: the file (its last two path parts) and line of the first frame outside
    minidist and the standard library, i.e. the line of the user's program that made this call."""
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_NOT_USER):
        frame = frame.f_back
    parts = frame.f_code.co_filename.replace(os.sep, "/").split("/")
    return f"{'/'.join(parts[-2:])}:{frame.f_lineno}"
