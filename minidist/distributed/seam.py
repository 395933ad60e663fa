"""The seam: the one place where the safety net is installed around the mechanism of this package.

The mechanism reads as it is: a :class:`~minidist.distributed.comm.Communicator` makes one MPI call per
primitive (``host_send`` is ``MPI_Send``), a collective checks its arguments and runs its algorithm
(``collectives.py``, ``algorithms/``). None of them imports the safety net (``safety/``: message tags,
deadlines, the liveness watchdog, debug fingerprints, trace spans), and none of them changes when it
is installed. It is installed here, once, by ``import minidist.distributed`` (the package's
``__init__`` calls ``safety.install()``), before any communicator exists, through three hooks:

* :data:`communicator_class`: the class :func:`~minidist.distributed.world.init` builds the world
  with. ``Communicator.split`` and ``dup`` build their result as the ``group_class`` of the
  communicator they split, so every group made from the world has it too. Installed: ``safety/watched.py``'s
  ``WatchedCommunicator``, a subclass that wraps the same primitives.
* :data:`on_init`: what ``init()`` runs once the world exists. Installed: the hook that makes an
  uncaught exception end every rank, and the liveness watchdog thread.
* :func:`collective`: the decorator every public collective wears: it puts the safety net's wrapper
  around the function (``safety/calls.py``: numbering, tags, checks, trace spans). The package
  installs before it loads ``collectives.py``, so every public collective is wrapped.

Reading the mechanism, read past these lines: with the default settings they change no number, no
message and no result, only what happens when something goes wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minidist.distributed.comm import Communicator

communicator_class: type[Communicator] = Communicator
on_init: list[Callable[[Communicator], None]] = []
_wrap: Callable[..., Callable[..., Any]] | None = None  # the safety net's wrapper, once installed


def collective(name: str, *, same_shape: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a public collective called ``name`` (``"all_reduce"``): the safety net's wrapper around it,
    once installed (a function marked before the install stays plain). ``same_shape=False`` for a
    collective whose ranks may pass arrays of different shapes (``all_gather``): then only the dtype
    must agree (``MINIDIST_DEBUG`` compares the calls)."""

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        return fn if _wrap is None else _wrap(fn, name, same_shape)

    return mark


def install(
    watched: type[Communicator],
    started: Callable[[Communicator], None],
    wrap: Callable[..., Callable[..., Any]],
) -> None:
    """Install the safety net: build every communicator as ``watched``, run ``started(world)`` at
    ``init()``, and wrap every collective marked from now on as ``wrap(fn, name, same_shape)``."""
    global communicator_class, _wrap
    communicator_class, _wrap = watched, wrap
    on_init.append(started)
