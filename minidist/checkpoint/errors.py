"""``CheckpointError``: a checkpoint that cannot be written or must not be loaded."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt, truncated, from an incompatible model, or newer than this code.

    ``save``/``load`` raise it on *every* rank with the same message (the ranks agree through a
    collective first, so none is left waiting). ``path`` is the file or folder at fault (or None) and
    ``problem`` the bare description; ``str(error)`` names both.
    """

    def __init__(self, problem: str, path: object = None) -> None:
        self.path = None if path is None else str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}" if self.path else problem)
