"""The interleaved 1F1B schedule: ``v`` model chunks per stage (Narayanan et al. 2021, §2.2.2).

Instead of one run of consecutive layers, each of the ``p`` ranks holds ``v`` smaller ones: the model is
cut into ``p * v`` chunks (*virtual stages*) and chunk ``g`` lives on rank ``g % p``, so rank r holds
chunks r, r + p, r + 2p, ... A microbatch goes round the ranks ``v`` times. Each computation is ``v``
times shorter, and so is the time it takes the pipeline to fill and drain: with ``t_f``, ``t_b`` the
forward/backward time of a whole stage, the bubble is ``(p - 1)(t_f + t_b) / v``, i.e. relative to the
ideal step ``m (t_f + t_b)`` it is ``(p - 1) / (v m)`` instead of 1F1B's ``(p - 1) / m`` (§2.2.2). The
price is ``v`` times more point-to-point messages.

**Order** (as Megatron-LM's ``forward_backward_pipelining_with_interleaving``): the microbatches go in
groups of ``p``; a rank runs the forwards of a group on chunk 0, then the same group on chunk 1, ...,
then the next group. Its k-th forward is therefore microbatch ``(k // (p v)) p + k % p`` on chunk
``(k % (p v)) // p``; its k-th backward is the same microbatch on chunk ``v - 1 - (k % (p v)) // p``
(backwards visit the chunks in reverse). Rank s first runs ``2 (p - s - 1) + (v - 1) p`` warm-up
forwards, then alternates one forward and one backward, then drains the remaining backwards. With
``m == p`` there is no steady state (Megatron runs all forwards first then, as GPipe).

**Messages.** Before a computation comes the receive of its input (an activation from the previous
virtual stage, or a gradient from the next), after it the send of its output. The sends after a
group of computations (one forward, one forward and one backward, or one backward) and the receives
before the next group are one :class:`Batch`: up to four messages, to and from both neighbours,
started together (Megatron's ``send_forward_backward_recv_forward_backward``);
``batched_messaging.py`` runs it with non-blocking sends and receives. ``simulate`` checks that
this never deadlocks under rendezvous semantics, for every ``(p, m, v)`` the tests draw.

``m`` must be a multiple of ``p``, as in Megatron-LM: the microbatch groups would otherwise be
incomplete, and the last chunk's forward of a microbatch could be needed before it exists.

``make_schedule`` (the end of this file) picks any of the three schedules by name; it lives here, the
module that knows them all, so that ``schedules.py`` need not import this one.
"""

from __future__ import annotations

from minidist.parallel.pipeline.schedules import (
    BACKWARD,
    FORWARD,
    RECV_ACT,
    RECV_GRAD,
    SCHEDULES,
    SEND_ACT,
    SEND_GRAD,
    Batch,
    Instruction,
    Schedule,
    Step,
    _check,
)


def interleaved(p: int, m: int, v: int) -> Schedule:
    """Interleaved 1F1B for ``p`` stages, ``m`` microbatches and ``v`` model chunks per stage.

    ``schedule.stages[s]`` lists stage s's steps; instructions carry the chunk (0..v-1). With ``v = 1``
    the order of computations is 1F1B's. Raises ``ValueError`` unless ``p, m, v >= 1`` and ``m`` is a
    multiple of ``p`` (the message names both and the nearest valid ``m``).
    """
    _check(p, m)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"the number of model chunks per stage v must be an integer >= 1, got {v!r}")
    if m % p:
        lower = m // p * p
        hint = f"{lower} or {lower + p}" if lower else f"{p}"
        raise ValueError(
            f"the interleaved schedule needs the number of microbatches m={m} to be a multiple of the "
            f"number of stages p={p} (microbatches go round the stages in groups of p); use m={hint}"
        )
    stages = tuple(tuple(_program(s, p, m, v)) for s in range(p))
    return Schedule("interleaved", p, m, stages, virtual_stages=v)


def compute_order(s: int, p: int, m: int, v: int) -> list[list[Instruction]]:
    """Stage s's forwards and backwards in order, grouped: ``[F]`` in the warm-up, ``[F, B]`` in the
    steady state, ``[B]`` in the cool-down (see the module docstring)."""
    total = m * v
    warmup = total if m == p else min(2 * (p - s - 1) + (v - 1) * p, total)

    def unit(k: int, kind: str) -> Instruction:
        group, within = divmod(k, p * v)
        chunk = within // p
        return Instruction(kind, group * p + k % p, chunk if kind == FORWARD else v - 1 - chunk)

    groups = [[unit(k, FORWARD)] for k in range(warmup)]
    groups += [[unit(warmup + j, FORWARD), unit(j, BACKWARD)] for j in range(total - warmup)]
    groups += [[unit(k, BACKWARD)] for k in range(total - warmup, total)]
    return groups


def _program(s: int, p: int, m: int, v: int) -> list[Step]:
    """Computation groups (one forward, or one forward and one backward, or one backward), each followed
    by one Batch: the sends of the group's outputs and the receives of the next group's inputs."""
    last = p * v - 1

    def receive(op: Instruction) -> list[Instruction]:
        g = op.chunk * p + s  # the virtual stage this computation belongs to
        if p == 1:  # all chunks on one rank: activations and gradients stay where they are
            return []
        if op.kind == FORWARD:
            return [Instruction(RECV_ACT, op.microbatch, op.chunk)] if g > 0 else []
        return [Instruction(RECV_GRAD, op.microbatch, op.chunk)] if g < last else []

    def send(op: Instruction) -> list[Instruction]:
        g = op.chunk * p + s
        if p == 1:
            return []
        if op.kind == FORWARD:
            return [Instruction(SEND_ACT, op.microbatch, op.chunk)] if g < last else []
        return [Instruction(SEND_GRAD, op.microbatch, op.chunk)] if g > 0 else []

    groups = compute_order(s, p, m, v)
    prog: list[Step] = []
    messages = [ins for op in groups[0] for ins in receive(op)]
    for j, group in enumerate(groups):
        if messages:
            prog.append(Batch(tuple(messages)))
        prog += group
        following = groups[j + 1] if j + 1 < len(groups) else []
        messages = [ins for op in group for ins in send(op)] + [
            ins for op in following for ins in receive(op)
        ]
    if messages:
        prog.append(Batch(tuple(messages)))
    return prog


def make_schedule(name: str, p: int, m: int, virtual_stages: int = 1) -> Schedule:
    """The schedule called ``name`` for ``p`` stages and ``m`` microbatches: ``"gpipe"``, ``"1f1b"``
    (``schedules.py``), or ``"interleaved"`` with ``virtual_stages`` model chunks per stage (above).

    Raises ``ValueError`` for an unknown name (the known ones are listed), ``p``/``m`` below 1, or
    ``virtual_stages`` other than 1 for GPipe/1F1B; ``interleaved`` raises as documented there.
    """
    if name == "interleaved":
        return interleaved(p, m, virtual_stages)
    if name not in SCHEDULES:
        raise ValueError(
            f"unknown pipeline schedule {name!r}; choose one of {sorted([*SCHEDULES, 'interleaved'])}"
        )
    if virtual_stages != 1:
        raise ValueError(
            f"virtual_stages={virtual_stages!r} needs schedule='interleaved'; {name} has 1 chunk"
        )
    return SCHEDULES[name](p, m)
