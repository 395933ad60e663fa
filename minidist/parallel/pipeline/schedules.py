"""Pipeline schedules as plain data: for each stage, the ordered list of what it does in one step.

A training step splits the batch into ``m`` microbatches that flow through ``p`` stages. A *schedule*
says, for every stage, in which order to run forward and backward passes of the microbatches and when
to send and receive activations (forward, to stage s+1) and gradients (backward, to stage s-1). It is
produced by a pure function of ``(p, m)``, so it can be printed, drawn, simulated and tested without
MPI; ``executor.py`` runs it (the separation ShallowSpeed uses).

* ``gpipe`` (Huang et al. 2019, "GPipe", §2.2): all forwards, then all backwards. Each stage holds the
  activations of all ``m`` microbatches at the turn.
* ``1f1b`` (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters using
  Megatron-LM", §2.2.1, the PipeDream-Flush schedule): stage s runs ``min(p-s-1, m)`` warm-up forwards,
  then alternates one forward and one backward, then drains the remaining backwards. It never holds more
  than ``p - s`` microbatches, and its bubble is the same as GPipe's.

Both have, with forward time ``t_f`` and backward time ``t_b`` per microbatch and stage, a step time of
``(m + p - 1)(t_f + t_b)`` of which each stage computes ``m (t_f + t_b)``: the *bubble fraction* is
``(p - 1) / (m + p - 1)`` (Narayanan et al. 2021, §2.2.1). ``simulate`` recomputes it from the
instruction lists, and the tests check that it does.

**Deadlock freedom.** The executor's messages (``messaging.py``) are *blocking* sends and receives.
MPI may complete a blocking send only once the receiver has posted the matching receive (rendezvous;
MPICH does so for large messages), so we must assume that worst case. Two rules make every schedule
here safe under it:

1. Per direction, the order agrees: stage s sends activations in the same microbatch order as stage
   s+1 receives them, and stage s+1 sends gradients in the order stage s receives them. (MPI also
   delivers messages between two ranks with the same tag in order, so the data match too.)
2. Where two neighbours would each send to the other at the same moment (1F1B's steady state: stage s
   sends activation i to s+1 while s+1 sends gradient j back), the send and the receive that follows it
   are one :class:`Exchange`, run as one ``MPI_Sendrecv`` whose two halves progress independently. This
   is Megatron-LM's ``send_forward_recv_backward`` / ``send_backward_recv_forward``. (The interleaved
   schedule, ``interleaved.py``, needs up to four messages at once, to and from both neighbours: a
   :class:`Batch`.)

``simulate`` executes a schedule with exactly these rendezvous semantics and raises
:class:`ScheduleDeadlockError` if no stage can move, so the tests prove rule 2 is enough for every
``(p, m)`` they draw.
"""

from __future__ import annotations

from dataclasses import dataclass

FORWARD, BACKWARD = "forward", "backward"
SEND_ACT, RECV_ACT, SEND_GRAD, RECV_GRAD = "send_act", "recv_act", "send_grad", "recv_grad"
COMPUTE = (FORWARD, BACKWARD)
_SHORT = {FORWARD: "F", BACKWARD: "B", SEND_ACT: "sA", RECV_ACT: "rA", SEND_GRAD: "sG", RECV_GRAD: "rG"}


@dataclass(frozen=True)
class Instruction:
    """One step of a stage: ``kind`` (``"forward"``, ``"send_act"``, ...) applied to one microbatch.

    ``chunk``: which of the rank's model chunks (interleaved schedules, ``interleaved.py``); always 0
    otherwise. Printed as ``F3`` for chunk 0 and ``F3.1`` for chunk 1.
    """

    kind: str
    microbatch: int
    chunk: int = 0

    def __str__(self) -> str:
        return f"{_SHORT[self.kind]}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")

    def peer_offset(self) -> int:
        """The stage it talks to, relative to this one: +1 (activations out, gradients in) or -1."""
        if self.kind in (SEND_ACT, RECV_GRAD):
            return 1
        if self.kind in (RECV_ACT, SEND_GRAD):
            return -1
        raise ValueError(f"{self.kind} is computation, it has no peer")


@dataclass(frozen=True)
class Exchange:
    """A send and a receive with the same neighbour, run together as one ``sendrecv`` (rule 2 above)."""

    send: Instruction
    recv: Instruction

    def __post_init__(self) -> None:
        if self.send.peer_offset() != self.recv.peer_offset():
            raise ValueError(f"an Exchange talks to one neighbour; {self.send} and {self.recv} do not")

    def __str__(self) -> str:
        return f"{self.send}+{self.recv}"


@dataclass(frozen=True)
class Batch:
    """Sends and receives, to and from both neighbours, started together and finished together.

    The interleaved schedule's steady state (``interleaved.py``) ends each forward+backward pair with
    up to four messages, as Megatron-LM's ``send_forward_backward_recv_forward_backward`` (a
    ``batch_isend_irecv``): every half progresses independently, as in an :class:`Exchange`.
    """

    messages: tuple[Instruction, ...]

    def __post_init__(self) -> None:
        if not self.messages or any(ins.kind in COMPUTE for ins in self.messages):
            raise ValueError(f"a Batch holds one or more messages, no computation; got {self.messages}")

    def __str__(self) -> str:
        return "+".join(map(str, self.messages))


Step = Instruction | Exchange | Batch


@dataclass(frozen=True)
class Schedule:
    """``stages[s]`` is stage s's ordered program for one training step of ``num_microbatches``.

    ``virtual_stages`` (v): model chunks per stage (rank); chunk k of stage s is *virtual stage*
    ``k * p + s`` of the ``p * v`` consecutive pieces of the model (1 except for ``interleaved``).
    """

    name: str
    num_stages: int
    num_microbatches: int
    stages: tuple[tuple[Step, ...], ...]
    virtual_stages: int = 1

    def __str__(self) -> str:
        v = f", v={self.virtual_stages} chunks per stage" if self.virtual_stages > 1 else ""
        lines = [
            f"{self.name} schedule, p={self.num_stages} stages, m={self.num_microbatches} microbatches{v}"
        ]
        lines += [f"stage {s}: " + " ".join(map(str, prog)) for s, prog in enumerate(self.stages)]
        return "\n".join(lines)

    def peer(self, stage: int, ins: Instruction) -> tuple[int, int]:
        """``(stage, chunk)`` that message ``ins`` of ``stage`` goes to or comes from.

        Activations go from virtual stage g to g + 1, gradients back; with several chunks per stage this
        wraps round (stage p-1's chunk k feeds stage 0's chunk k+1). Raises ``ValueError`` if that
        virtual stage does not exist (a message beyond either end of the pipeline).
        """
        p = self.num_stages
        g = ins.chunk * p + stage + ins.peer_offset()
        if not 0 <= g < p * self.virtual_stages:
            where = f"stage {g}" if self.virtual_stages == 1 else f"virtual stage {g}"
            raise ValueError(f"stage {stage} of {p} has {ins}, but {where} does not exist")
        return g % p, g // p


def parts(step: Step) -> tuple[Instruction, ...]:
    """The instructions a step consists of: itself, an Exchange's send and receive (in that order), or a
    Batch's messages."""
    if isinstance(step, Batch):
        return step.messages
    return (step.send, step.recv) if isinstance(step, Exchange) else (step,)


def _check(p: int, m: int) -> None:
    for name, value in (("number of stages p", p), ("number of microbatches m", m)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def gpipe(p: int, m: int) -> Schedule:
    """All forwards of the ``m`` microbatches, then all backwards (Huang et al. 2019, §2.2).

    Raises ``ValueError`` unless ``p >= 1`` and ``m >= 1``.
    """
    _check(p, m)
    stages = []
    for s in range(p):
        prog: list[Step] = []
        for i in range(m):
            prog += [Instruction(RECV_ACT, i)] if s > 0 else []
            prog += [Instruction(FORWARD, i)]
            prog += [Instruction(SEND_ACT, i)] if s < p - 1 else []
        for i in range(m):
            prog += [Instruction(RECV_GRAD, i)] if s < p - 1 else []
            prog += [Instruction(BACKWARD, i)]
            prog += [Instruction(SEND_GRAD, i)] if s > 0 else []
        stages.append(tuple(prog))
    return Schedule("gpipe", p, m, tuple(stages))


def one_f_one_b(p: int, m: int) -> Schedule:
    """One-forward-one-backward (PipeDream-Flush; Narayanan et al. 2021, §2.2.1, Figure 4 top).

    Stage s: ``w = min(p - s - 1, m)`` warm-up forwards; then ``m - w`` rounds of one forward and one
    backward; then the last ``w`` backwards. Any ``m >= 1`` works, ``m < p`` included (then the
    warm-up is cut short and the pipeline never fills). Raises ``ValueError`` unless ``p, m >= 1``.
    """
    _check(p, m)
    # BEGIN SOLUTION A5.1: every stage's 1F1B program: warm-up, steady state with Exchanges, cool-down
    stages = []
    for s in range(p):
        first, last = s == 0, s == p - 1
        warmup = min(p - s - 1, m)
        prog: list[Step] = []
        for i in range(warmup):  # warm-up: forwards only (never the last stage, for which warmup = 0)
            prog += [Instruction(RECV_ACT, i)] if not first else []
            prog += [Instruction(FORWARD, i), Instruction(SEND_ACT, i)]
        steady = m - warmup
        if steady > 0 and not first:
            prog.append(Instruction(RECV_ACT, warmup))
        for j in range(steady):  # steady state: forward of microbatch warmup + j, backward of j
            i = warmup + j
            prog.append(Instruction(FORWARD, i))
            if not last:  # the output goes down as the gradient of an earlier microbatch comes up
                prog.append(Exchange(Instruction(SEND_ACT, i), Instruction(RECV_GRAD, j)))
            prog.append(Instruction(BACKWARD, j))
            if not first:  # the gradient goes up as the next forward's input comes down
                more = j < steady - 1
                prog.append(
                    Exchange(Instruction(SEND_GRAD, j), Instruction(RECV_ACT, i + 1))
                    if more
                    else Instruction(SEND_GRAD, j)
                )
        for j in range(steady, m):  # cool-down: the backwards of the warm-up microbatches
            prog += [Instruction(RECV_GRAD, j), Instruction(BACKWARD, j)]
            prog += [Instruction(SEND_GRAD, j)] if not first else []
        stages.append(tuple(prog))
    # END SOLUTION
    return Schedule("1f1b", p, m, tuple(stages))


SCHEDULES = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
}  # by name (make_schedule, in interleaved.py, adds the third)


def peak_activations(schedule: Schedule) -> list[int]:
    """Per stage, the most microbatches whose forward has run and whose backward has not (held graphs)."""
    peaks = []
    for prog in schedule.stages:
        live = peak = 0
        for step in prog:
            for ins in parts(step):
                live += {FORWARD: 1, BACKWARD: -1}.get(ins.kind, 0)
                peak = max(peak, live)
        peaks.append(peak)
    return peaks
