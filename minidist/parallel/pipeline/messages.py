"""What pipeline stages send each other: a shape header, then activations and gradients, on known tags.

**Why a header.** An MPI receive needs a buffer of the right size before the message arrives, but only
the sender knows the shape of its stage's output: it depends on the batch size (which may change from
one step to the next) and on the layers, and interleaved chunks may each have a different width. So
the first activation a step sends across a stage boundary is preceded by a small header that describes
it. Nothing else needs one: every later activation of that step across the same boundary has the same
shape (the microbatches are equal), and a gradient has the shape of the activation it belongs to,
which the receiving stage produced itself. The cost is one tiny message per boundary and step.

**Header layout**: a NumPy ``int64`` array of ``HEADER_SIZE = 2 + MAX_DIMS`` elements::

    [dtype code, ndim, shape[0], ..., shape[ndim - 1], 0, ..., 0]

with the dtype code an index into ``DTYPES`` (``float16``, ``float32``, ``float64``). Every header has
the same length, so the receiver can preallocate it (:func:`header_buffer`) without knowing anything.

**Tags** say what a message is, so two messages between the same two ranks are never confused:

* ``TAG_HEADER``, ``TAG_ACT``, ``TAG_GRAD`` (1, 2, 3): GPipe and 1F1B (``BlockingMessaging``);
* ``TAG_PREDICT_HEADER``, ``TAG_PREDICT`` (11, 12): forward-only passes (``inference.py``);
* ``batched_tag`` (100 and up): the interleaved schedule (``BatchedMessaging``), one tag per message
  in flight (its docstring says why).

Arrays themselves travel as raw buffers (``Communicator.send``/``recv`` or ``dist.p2p_batch``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist.distributed.checks import MAX_TAG

DTYPES = ("float16", "float32", "float64")  # what a stage may send; the header stores the index
# dtype -> its index, looked up by the dtype itself: str(dtype) is Python-level NumPy code, ~29,000
# instructions (NumPy 1.26), and encode_header called it twice
_CODES = {np.dtype(name): code for code, name in enumerate(DTYPES)}
MAX_DIMS = 8  # most axes an activation may have
HEADER_SIZE = 2 + MAX_DIMS  # int64 elements: dtype code, ndim, the axes (zero-padded)

TAG_HEADER, TAG_ACT, TAG_GRAD = 1, 2, 3  # blocking training messages
TAG_PREDICT_HEADER, TAG_PREDICT = 11, 12  # forward-only passes
TAG_BASE = 100  # batched training messages: TAG_BASE and up (batched_tag)
ACT, GRAD, HEADER = 0, 1, 2  # the ``kind`` of a batched message


def encode_header(array: Any) -> np.ndarray:
    """The header describing ``array`` (NumPy or CuPy): int64, shape ``(HEADER_SIZE,)``, on the host.

    Raises ``TypeError`` if ``array``'s dtype is not one of ``DTYPES`` or it has more than ``MAX_DIMS``
    axes (a stage's output must be a floating array to be sent on).
    """
    code = _CODES.get(array.dtype)
    if code is None or array.ndim > MAX_DIMS:
        raise TypeError(
            f"a pipeline stage's output must be a floating array ({', '.join(DTYPES)}) with at most "
            f"{MAX_DIMS} axes to be sent to the next stage, got {array.dtype} with shape {array.shape}"
        )
    header = np.zeros(HEADER_SIZE, np.int64)
    header[0], header[1] = code, array.ndim
    header[2 : 2 + array.ndim] = array.shape
    return header


def header_buffer() -> np.ndarray:
    """A zeroed int64 host array of shape ``(HEADER_SIZE,)`` to receive a header into."""
    return np.zeros(HEADER_SIZE, np.int64)


def decode_header(header: np.ndarray) -> tuple[tuple[int, ...], np.dtype]:
    """``(shape, dtype)`` of the array that ``header`` (from :func:`encode_header`) describes.

    Raises ``ValueError`` if ``header`` is not a valid header (wrong length, unknown dtype code, more
    than ``MAX_DIMS`` axes or a negative axis), e.g. when a message was received on the wrong tag.
    """
    code, ndim = (int(header[0]), int(header[1])) if len(header) == HEADER_SIZE else (-1, -1)
    shape = tuple(int(d) for d in header[2 : 2 + ndim]) if 0 <= ndim <= MAX_DIMS else (-1,)
    if not 0 <= code < len(DTYPES) or min(shape, default=0) < 0:
        raise ValueError(
            f"not a pipeline message header: {np.asarray(header).tolist()} (expected {HEADER_SIZE} int64: "
            f"dtype code 0..{len(DTYPES) - 1}, number of axes 0..{MAX_DIMS}, the axes)"
        )
    return shape, np.dtype(DTYPES[code])


def batched_tag(boundary: int, microbatch: int, kind: int, num_boundaries: int) -> int:
    """The tag of a batched message: ``kind`` (``ACT``, ``GRAD`` or ``HEADER``) of ``microbatch`` across
    chunk ``boundary`` (between virtual stages ``boundary`` and ``boundary + 1``, of ``num_boundaries``).

    With ``p = 2`` ranks a rank's next and previous rank are the same, and one Batch can hold an
    activation and a gradient for that neighbour, of different chunks, at once; so the tag names both
    the boundary and the microbatch::

        tag = TAG_BASE + 3 * (boundary + num_boundaries * (microbatch mod W)) + kind

    with ``W`` the largest period that keeps tags within MPI's guaranteed 0..32767 (``W = 725`` for 15
    boundaries: more than ``m`` in every ordinary configuration). Two messages in flight at the same
    time thus never share a tag; two that do (microbatches ``i`` and ``i + W`` of one boundary) are sent
    and received in the same order on both sides, and MPI does not let messages with the same source,
    tag and communicator overtake each other, so they still pair up correctly.
    """
    period = max((MAX_TAG - TAG_BASE + 1) // (3 * num_boundaries), 1)  # W
    return TAG_BASE + 3 * (boundary + num_boundaries * (microbatch % period)) + kind
