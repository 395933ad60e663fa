"""Keep freed host memory in the process, so that a training step does not page-fault its arrays in anew.

Every step of a small model allocates and frees the same arrays (activations, gradients,
temporaries) of a few hundred KiB each. With its default settings, glibc's ``malloc`` gives memory
back to the operating system eagerly: an array of 128 KiB or more gets its own ``mmap`` until the
first such array is freed, and free memory at the top of the heap beyond a small threshold is
returned with ``brk``/``madvise``. The next step then touches fresh pages, and every 4 KiB page
costs a page fault in which the kernel zeroes it. Measured on the 64-256-256-10 MLP with batch 128
(``docs/performance.md``, "The operating system: page faults"): about 270 minor page faults per step
on one process, where a hand-written NumPy loop of the same arithmetic, which frees less per step,
faults none; with them (and costs cut since) the step took 2.0-2.2x that loop's time.

:func:`keep_freed_memory` sets the two ``mallopt`` thresholds to the values glibc's own dynamic
rule settles on after a 32 MiB array has been freed (``mallopt(3)``: the mmap threshold rises to
the size of a freed mmapped chunk, at most 32 MiB on 64-bit; the trim threshold follows at twice
that): arrays under 32 MiB come from the heap, and up to 64 MiB of free memory at the heap's top
stays with the process. The cost: freed memory *below* a block still in use (a hole) is never handed
back, so a program that allocates many arrays under 32 MiB and keeps a small one after each can keep
its peak footprint after freeing the big ones (glibc does the same once its own threshold has moved,
e.g. after any 32 MiB array was freed). Switch it off for such a program.
Importing PyTorch has the same effect here (measured: no faults per step once ``torch`` is
imported). Larger arrays are still mapped and unmapped one by one, as before.

The setting is per process and lasts until exit. It is skipped where it does not apply or the user
chose otherwise: not glibc (macOS, musl), ``MINIDIST_KEEP_FREED_MEMORY=0`` (or false, no, off), or
any of glibc's own ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` / ``MALLOC_TOP_PAD_`` /
``GLIBC_TUNABLES`` set in the environment (then the user's settings stand). This module imports
nothing of minidist.

Source: glibc ``mallopt(3)`` (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD and their dynamic adjustment).
"""

from __future__ import annotations

import ctypes
import os
import sys

MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
TRIM_THRESHOLD_BYTES = 2 * MMAP_THRESHOLD_BYTES  # what glibc's dynamic rule pairs with it
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # the parameter numbers of <malloc.h>
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")

applied = False  # whether keep_freed_memory() changed the settings in this process


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds (32 MiB and 64 MiB); return whether they were set.

    Both must be set together: setting either one switches off glibc's dynamic adjustment of the
    other, and a fixed 128 KiB mmap threshold alone would map every activation of 128 KiB anew.
    Never raises: where ``mallopt`` is missing or refuses, nothing changes and this returns False.
    """
    global applied
    if os.environ.get("MINIDIST_KEEP_FREED_MEMORY", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if not sys.platform.startswith("linux") or any(name in os.environ for name in _USER_SETTINGS):
        return False
    try:
        # The C library the interpreter already runs on: CDLL(None) looks up symbols in the process
        # itself (ctypes.util.find_library would spawn ldconfig, ~30 ms at every import, every rank).
        mallopt = ctypes.CDLL(None).mallopt  # AttributeError on a C library without it (musl)
    except (OSError, AttributeError):
        return False
    # mallopt returns 1 on success. The mmap threshold first: the trim threshold then stays put.
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    ok = ok and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    applied = ok
    return ok
