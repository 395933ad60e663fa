"""``CheckpointError``, what ``save`` and ``load`` raise, and ``NewerFormatError``.

A checkpoint problem seen by one rank must stop *every* rank with the same error, or the others
would wait forever in the next collective. How the ranks come to raise the same one
(``on_every_rank``, ``any_failure``) is in ``checks.py``; the classes are here, below everything
else of the package, because every file raises them.
"""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt, truncated, from an incompatible model, or newer than this code.

    ``save``/``load`` raise it on *every* rank with the same message (the ranks agree through a
    collective first, so none is left waiting). ``path`` is the file or folder at fault (or None) and
    ``problem`` the bare description; ``str(error)`` names both.
    """

    def __init__(self, problem: str, path: object = None) -> None:
        # Both in args: the agreement rebuilds the error on the other ranks from its args, path included.
        super().__init__(problem, None if path is None else str(path))

    @property
    def problem(self) -> str:
        return self.args[0]

    @property
    def path(self) -> str | None:
        return self.args[1]

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}" if self.path else self.problem


class NewerFormatError(CheckpointError):
    """A checkpoint written by a newer minidist: not damaged, so ``save`` never moves it aside."""
