"""The seeded random generator every minidist component draws from, and the states of all generators.

``manual_seed(s)`` resets it, so two runs (or one process and N processes) that call
``manual_seed`` with the same seed draw the same numbers: initial weights and dropout masks
are then reproducible. Numbers are drawn on the host with NumPy's PCG64 and moved to the
backend, so the CPU and GPU backends draw identical values from one seed.

Other generators (the tensor-parallel RNG tracker) live in higher layers, but their states are saved
and restored together with this one, by checkpoints and by activation recomputation. So they
:func:`register` here when they are created, and :func:`get_all_rng_states` /
:func:`set_all_rng_states` cover the default generator plus every registered one. Code that saves or
restores states calls only this module, which sits below all of it (no import points upward).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

_generator = np.random.default_rng(0)


def manual_seed(seed: int) -> None:
    """Seed the generator that minidist uses on this rank (weights init, dropout).

    Raises ``TypeError`` if ``seed`` is not an integer.
    """
    global _generator
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise TypeError(f"manual_seed expects an integer seed, got {type(seed).__name__}")
    _generator = np.random.default_rng(int(seed))


def generator() -> np.random.Generator:
    """The current generator (replaced by every ``manual_seed`` call)."""
    return _generator


def get_rng_state() -> dict:
    """The default generator's state as a JSON-serialisable dict."""
    return _generator.bit_generator.state


def set_rng_state(state: dict) -> None:
    """Restore a state returned by :func:`get_rng_state`."""
    _generator.bit_generator.state = state


# --- every generator's state: the default one plus the registered ones --------------------------
class HasStates(Protocol):
    """What a registered generator offers: its states as JSON-serialisable data, and their restore."""

    def get_states(self) -> Any: ...

    def set_states(self, states: Any) -> None: ...


DEFAULT = "rng"  # the default generator's key in get_all_rng_states() (and in checkpoint manifests)
_registered: dict[str, HasStates] = {}
_waiting: dict[str, Any] = {}  # states restored before their generator registered (see set_all_rng_states)


def register(name: str, owner: HasStates) -> None:
    """Include ``owner``'s states, under ``name``, in :func:`get_all_rng_states` from now on.

    Called once by the module that creates the generator (``minidist.parallel.tensor_parallel``
    registers its RNG tracker as ``"tp_rng"``). A state restored for ``name`` before it registered is
    handed to ``owner`` now. Raises ``ValueError`` for the name ``"rng"`` or a name taken by another owner.
    """
    if name == DEFAULT or _registered.get(name, owner) is not owner:
        raise ValueError(f"a random generator is already registered as {name!r}")
    _registered[name] = owner
    if name in _waiting:
        owner.set_states(_waiting.pop(name))


def get_all_rng_states() -> dict[str, Any]:
    """``{"rng": default generator state, name: states of each registered generator}``, JSON-serialisable.

    A copy: drawing numbers afterwards does not change it.
    """
    states = {DEFAULT: get_rng_state()}  # NumPy builds a new dict on every read
    for name, owner in _registered.items():
        states[name] = owner.get_states()
    return states


def set_all_rng_states(states: dict[str, Any]) -> None:
    """Restore what :func:`get_all_rng_states` returned; a name whose value is None is left alone.

    A state for a name nobody registered yet (tensor parallelism not imported) waits and is given to
    that generator when it registers, so the order of restoring and importing does not matter.
    """
    set_rng_state(states[DEFAULT])
    for name, value in states.items():
        if name == DEFAULT or value is None:
            continue
        if name in _registered:
            _registered[name].set_states(value)
        else:
            _waiting[name] = value
