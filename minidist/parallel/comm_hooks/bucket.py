"""What a communication hook sees: one bucket of gradients (``GradBucket``), and the bytes it moved.

DDP hands each bucket to the hook as a :class:`GradBucket`, PyTorch's name and methods
(``torch.distributed.GradBucket``): ``index()``, ``buffer()``, ``gradients()``, ``parameters()``,
``is_last()``, ``set_buffer()``. Two additions of ours, because our DDP communicates on a communicator of
its own (``data_parallel/ddp.py``: a duplicate of its group, so that the communication thread's messages
never meet the main thread's): ``bucket.group``, the communicator every collective of the hook must use,
and ``bucket.stats``, where the hook's collectives count their bytes (:func:`all_reduce`).

:class:`CommStats` is the accounting a DDP keeps in ``ddp.comm_stats``, with or without a hook: how many
bytes its gradient communication really sent, and how many a plain all-reduce would have carried.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import minidist.distributed as dist


class CommStats:
    """Bytes one DDP's gradient communication moved, summed over steps (this rank's view).

    Attributes (all ints, bytes unless said otherwise):
        steps: backward passes that communicated (a pass counts when its last bucket is done).
        bytes_sent: bytes that left this rank, measured: ``Communicator.bytes_sent`` of DDP's channel
            before and after each bucket (``distributed/traffic.py``). It counts every message of the
            hand-written algorithms, DDP's bookkeeping flags included; collectives with
            ``algorithm="mpi"`` send outside this count, so the hooks use ``"auto"``.
        payload_bytes: bytes of the arrays the collectives reduced (a ring all-reduce of ``N`` payload
            bytes on ``n`` ranks sends ``2 (n-1)/n N`` of them).
        uncompressed_bytes: bytes of the gradient buffers, the payload a plain all-reduce carries.

    ``bytes_saved`` is ``uncompressed_bytes - payload_bytes`` and ``compression_ratio`` their ratio:
    2 for fp16/bf16, ``(n m) / ((n + m) r)`` per compressed ``n x m`` matrix for PowerSGD. Compare
    ``bytes_sent`` of a run with a hook against a run without one for the measured saving.
    """

    def __init__(self) -> None:
        self.steps = 0
        self.bytes_sent = 0
        self.payload_bytes = 0
        self.uncompressed_bytes = 0

    @property
    def bytes_saved(self) -> int:
        return self.uncompressed_bytes - self.payload_bytes

    @property
    def compression_ratio(self) -> float:
        return self.uncompressed_bytes / self.payload_bytes if self.payload_bytes else 1.0

    def record(self, gradient_bytes: int, sent: int, is_last: bool, plain: bool) -> None:
        """DDP's count of one bucket: its gradient bytes, the bytes its communication sent, whether it
        ended a step, and whether it was a plain all-reduce (whose payload is the gradients; a hook's
        collectives count their own payload through :func:`all_reduce`)."""
        self.uncompressed_bytes += gradient_bytes
        self.bytes_sent += sent
        if plain:
            self.payload_bytes += gradient_bytes
        if is_last:
            self.steps += 1

    def per_step(self) -> dict[str, float]:
        """The counters divided by ``steps`` (zeros before the first step), plus the ratio."""
        k = max(self.steps, 1)
        return {
            "bytes_sent": self.bytes_sent / k,
            "payload_bytes": self.payload_bytes / k,
            "uncompressed_bytes": self.uncompressed_bytes / k,
            "bytes_saved": self.bytes_saved / k,
            "compression_ratio": self.compression_ratio,
        }

    def __repr__(self) -> str:
        return (
            f"CommStats(steps={self.steps}, bytes_sent={self.bytes_sent}, "
            f"payload_bytes={self.payload_bytes}, uncompressed_bytes={self.uncompressed_bytes})"
        )


class GradBucket:
    """One DDP bucket as a communication hook sees it (PyTorch's ``GradBucket``).

    Args (DDP builds it; users do not):
        index: the bucket's index (DDP's bucket 0 holds the last layer's parameters, ``buckets.py``).
        buffer: the flat 1-D gradient buffer, ``sum(p.size for p in params)`` elements of the
            parameters' dtype, holding this rank's local (not yet averaged) gradients.
        params: the parameters whose gradients the buffer holds, in buffer order.
        is_last: whether this is the last bucket DDP communicates in a backward pass.
        group: the communicator the hook's collectives must use (see the module docstring).
        stats: the :class:`CommStats` the hook's collectives add to.
    """

    def __init__(
        self,
        index: int,
        buffer: Any,
        params: Sequence[Any],
        is_last: bool,
        group: dist.Communicator,
        stats: CommStats | None = None,
    ) -> None:
        self._index, self._buffer, self._params, self._is_last = index, buffer, list(params), is_last
        self.group = group
        self.stats = stats if stats is not None else CommStats()

    def index(self) -> int:
        return self._index

    def buffer(self) -> Any:
        """The flat 1-D gradient buffer (a view into DDP's bucket: writing it writes the bucket)."""
        return self._buffer

    def set_buffer(self, buffer: Any) -> None:
        """Replace the buffer's contents with ``buffer`` (same shape), in place."""
        self._buffer[...] = buffer

    def gradients(self) -> list[Any]:
        """One view of ``buffer()`` per parameter, in the parameter's shape."""
        return [piece for _, piece in self.pieces()]

    def parameters(self) -> list[Any]:
        return list(self._params)

    def is_last(self) -> bool:
        return self._is_last

    def pieces(self) -> Iterator[tuple[int, Any]]:
        """``(offset, view)`` per parameter: where its gradient starts in the buffer, and the view."""
        offset = 0
        for p in self._params:
            yield offset, self._buffer[offset : offset + p.size].reshape(p.shape)
            offset += p.size


def all_reduce(array: Any, bucket: GradBucket, op: str = "sum") -> Any:
    """``dist.all_reduce(array, op, group=bucket.group)`` in place, counting ``array.nbytes`` as payload.

    The hooks' one way to communicate, so that ``ddp.comm_stats.payload_bytes`` is what they carried.
    Returns ``array``. Raises as :func:`minidist.distributed.all_reduce`.
    """
    bucket.stats.payload_bytes += array.nbytes
    return dist.all_reduce(array, op=op, group=bucket.group)
