"""The memory formulas one rank's ``MemoryTracker`` figures are compared with.

Pure arithmetic (imports nothing of minidist), like the other perfmodel modules. Two families:

**Model states** (Rajbhandari et al. 2020, "ZeRO", §5): P parameters of ``b`` bytes, gradients of
``b`` bytes, ``K`` bytes of optimizer state per parameter (AdamW: exp_avg + exp_avg_sq = 2 b; SGD with
momentum: b). On N data-parallel ranks, rank r owns chunk r of ``numpy.array_split(range(P), N)``:

    plain data parallel (DDP):   b P     + b P     + K P          (§5: the baseline, (2 + 2 + K) Psi)
    ZeRO-1 (P_os, §5.1):         b P     + b P     + K P_r
    ZeRO-2 (P_os+g, §5.2):       b P     + b P_r   + K P_r
    ZeRO-3 / FSDP (P_os+g+p):    b P_r   + b P_r   + K P_r   + b G  (G: the elements of the units
                                                                    gathered at the moment, §5.3)

measured after ``optimizer.step()``, before ``zero_grad()``. The paper writes (2 + 2 + K) Psi with
16-bit parameters and gradients and K = 12 (fp32 master copy, momentum, variance); in float32 with no
master copy b = 4 and K = 8 for AdamW.

**Activations of a GPT layer** (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", §4, Table 2): the paper counts s b h (34 + 5 a s / h) bytes per layer in 16-bit
(s sequence, b batch, h width, a heads, t tensor-parallel size; sequence parallelism divides it all by
t). minidist's engine differs, and :func:`gpt_layer_activation_bytes` counts exactly what it holds:

* every value is ``itemsize`` bytes (4 in float32), dropout masks too; with dropout 0 there are none;
* an op keeps *all* its inputs until its backward (the paper counts only what backward reads): the
  residual adds' inputs and, under tensor parallelism, the row-parallel layer's partial sum (s b h, before
  the all-reduce or reduce-scatter) and its reduced copy are held;
* attention keeps q * scale (s b h / t) and the softmax output (a s^2 b / t), not the scores or a mask;
* LayerNorm keeps its input, the normalised x-hat (s b h each) and 1/std (s b), plus weight / h (h);
* GELU (tanh form) keeps its input and the tanh (4 s b h / t each); GELU's output is the MLP
  projection's input (4 s b h / t);
* joining the heads (transpose then reshape) copies the attention output (s b h / t) when a rank has
  more than one head and s > 1; with one head per rank NumPy's reshape is a view.

Per layer, in values (multiply by ``itemsize``): c = 1 when the heads' join copies, else 0:

    GPT Block (one process):           (25 + c) s b h + a s^2 b + 2 s b + 2 h
    ParallelBlock, t ranks:            (12 + (17 + c) / t) s b h + a s^2 b / t + 2 s b + 2 h
    ParallelBlock + sequence parallel: (2 + (27 + c) / t) s b h + a s^2 b / t + 2 s b / t + 2 h

(so 26 s b h + a s^2 b + 2 s b + 2 h for a GPT block with several heads, against the paper's 34 s b h +
5 a s^2 b in 16-bit). ``tests/memory/test_memory.py`` measures all three to the byte.
"""

from __future__ import annotations

from collections.abc import Sequence


def shard_elements(numel: int, world_size: int, rank: int) -> int:
    """Elements of chunk ``rank`` of ``numpy.array_split(range(numel), world_size)`` (the first
    ``numel % world_size`` chunks have one more). Raises ``ValueError`` for a rank outside the world."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size} ranks")
    return numel // world_size + (1 if rank < numel % world_size else 0)


def model_state_bytes(
    num_params: int,
    layout: str = "ddp",
    world_size: int = 1,
    rank: int = 0,
    param_bytes: int = 4,
    optimizer_bytes_per_param: int = 8,
    gathered_elements: int = 0,
    unit_sizes: Sequence[int] | None = None,
    ddp_bookkeeping_elements: int = 0,
) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state on ``rank`` after ``step()`` (module docstring).

    Args:
        num_params: P, distinct parameters of the model (a tied weight once).
        layout: "ddp" (also one process), "zero1", "zero2" or "fsdp" (ZeRO-3).
        param_bytes: b, bytes per parameter and per gradient value (4 in float32).
        optimizer_bytes_per_param: K (AdamW in float32: 8; SGD with momentum: 4).
        gathered_elements: under FSDP, elements of the units gathered at that moment (0 after step).
        unit_sizes: under FSDP, the elements of each unit: each unit's flat vector is split on its own,
            so rank r holds the sum of its chunks of each (default: one unit of ``num_params``).
        ddp_bookkeeping_elements: DDP's bucket buffers carry this many more elements after the
            gradients (``DistributedDataParallel``: one per parameter tensor, plus one), and the
            ``.grad`` views keep the whole buffer alive, so they count as gradients.

    Returns: ``{"parameters", "gradients", "optimizer_state", "gathered_parameters", "total"}`` in bytes.

    Raises: ``ValueError`` for an unknown layout.
    """
    mine = shard_elements(num_params, world_size, rank)
    if layout == "fsdp" and unit_sizes is not None:
        mine = sum(shard_elements(n, world_size, rank) for n in unit_sizes)
    full, b, k = num_params, param_bytes, optimizer_bytes_per_param
    table = {
        "ddp": (b * full, b * (full + ddp_bookkeeping_elements), k * full),
        "zero1": (b * full, b * full, k * mine),
        "zero2": (b * full, b * mine, k * mine),
        "fsdp": (b * mine, b * mine, k * mine),
    }
    if layout not in table:
        raise ValueError(f"unknown layout {layout!r}; use one of {sorted(table)}")
    params, grads, state = table[layout]
    out = {"parameters": params, "gradients": grads, "optimizer_state": state}
    out["gathered_parameters"] = b * gathered_elements if layout == "fsdp" else 0
    out["total"] = sum(out.values())
    return out


def gpt_layer_activation_bytes(
    batch: int,
    seq: int,
    hidden: int,
    heads: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    itemsize: int = 4,
    parallel_block: bool | None = None,
) -> int:
    """Bytes of activations one GPT layer holds on one rank after forward (module docstring), dropout 0.

    Args:
        batch, seq, hidden, heads: b, s (the full sequence), h, a.
        tp: t, tensor-parallel ranks; ``sequence_parallel``: Korthikanti's §4.2.2 on top.
        itemsize: bytes per value (4 float32, 8 float64).
        parallel_block: ``ParallelBlock`` (column / row layers, ``ParallelGPT``) rather than ``Block``
            (``GPT``); default: ``tp > 1 or sequence_parallel``.

    Raises: ``ValueError`` if t does not divide a (and s under sequence parallelism).
    """
    if heads % tp or (sequence_parallel and seq % tp):
        raise ValueError(f"tp={tp} must divide heads={heads} (and seq={seq} with sequence parallelism)")
    parallel = tp > 1 or sequence_parallel if parallel_block is None else parallel_block
    sbh, local_heads = seq * batch * hidden, heads // tp
    c = 1 if local_heads > 1 and seq > 1 else 0  # the heads' join copies (module docstring)
    scores = local_heads * seq * seq * batch
    if not parallel:
        values = (25 + c) * sbh + scores + 2 * seq * batch + 2 * hidden
    elif not sequence_parallel:
        values = 12 * sbh + (17 + c) * sbh // tp + scores + 2 * seq * batch + 2 * hidden
    else:
        values = 2 * sbh + (27 + c) * sbh // tp + scores + 2 * seq * batch // tp + 2 * hidden
    return itemsize * values


def gpt_activation_bytes(
    batch: int,
    seq: int,
    hidden: int,
    heads: int,
    layers: int,
    vocab: int,
    itemsize: int = 4,
    index_itemsize: int = 8,
) -> int:
    """Bytes of activations a one-process ``GPT`` (tied head, dropout 0) holds at the end of the forward
    of ``cross_entropy(model(idx).reshape(-1, V), targets.reshape(-1))``, with ``idx`` and ``targets``
    two distinct integer arrays of ``index_itemsize`` bytes per id. That is the peak of activations.

    The layers (:func:`gpt_layer_activation_bytes`), plus the ends: ids b s and positions s (integers),
    token and position embeddings (s b h + s h), ``ln_f`` (2 s b h + s b + h), the head's input (s b h),
    the logits and the loss's probabilities (2 s b V), the loss's row numbers and the targets (2 s b
    integers).
    """
    sb, sbh = seq * batch, seq * batch * hidden
    ends = itemsize * (sbh + seq * hidden + 2 * sbh + sb + hidden + sbh + 2 * sb * vocab)
    ids = index_itemsize * (sb + seq + 2 * sb)
    per_layer = gpt_layer_activation_bytes(batch, seq, hidden, heads, itemsize=itemsize)
    return layers * per_layer + ends + ids
