"""What makes a list of instructions a correct 1F1B program, checked independently of minidist.

``check_one_f_one_b(schedule, p, m)`` raises ``AssertionError`` in plain words for the first broken
rule; the rendezvous replay is written here (not imported from ``minidist.parallel.pipeline``), so a
student's copy cannot change what "deadlock" means. The rules (Narayanan et al. 2021, §2.2.1):

1. every stage runs each microbatch's forward and backward once, in microbatch order;
2. it exchanges exactly the messages its position needs (none beyond either end of the pipeline),
   each direction in microbatch order, an activation received before its forward and a gradient
   before its backward;
3. stage s holds at most min(p - s, m) microbatches' activations at once (that is 1F1B; GPipe holds m);
4. the first activation message of a stage is a plain instruction (the executor sends the shape
   header with it), not part of an Exchange;
5. replayed with *rendezvous* sends (a blocking send completes only when the receiver reaches the
   matching receive; the two halves of an Exchange complete independently, like MPI_Sendrecv), every
   stage reaches its end: no deadlock.
"""

from __future__ import annotations

from minidist.parallel.pipeline.schedules import (
    BACKWARD,
    FORWARD,
    RECV_ACT,
    RECV_GRAD,
    SEND_ACT,
    SEND_GRAD,
    Exchange,
    Instruction,
)

MATCH = {SEND_ACT: RECV_ACT, RECV_ACT: SEND_ACT, SEND_GRAD: RECV_GRAD, RECV_GRAD: SEND_GRAD}
OFFSET = {SEND_ACT: 1, RECV_GRAD: 1, RECV_ACT: -1, SEND_GRAD: -1}
SHORT = {FORWARD: "F", BACKWARD: "B", SEND_ACT: "sA", RECV_ACT: "rA", SEND_GRAD: "sG", RECV_GRAD: "rG"}


def parts(step) -> list:
    if isinstance(step, Exchange):
        return [step.send, step.recv]
    if isinstance(step, Instruction):
        return [step]
    messages = getattr(step, "messages", None)
    if messages is not None:
        return list(messages)
    raise AssertionError(f"a program step must be an Instruction or an Exchange, got {step!r}")


def name(ins) -> str:
    return f"{SHORT.get(ins.kind, ins.kind)}{ins.microbatch}"


def program_text(prog) -> str:
    return " ".join("+".join(name(i) for i in parts(step)) for step in prog)


def check_one_f_one_b(schedule, p: int, m: int) -> None:
    where = f"one_f_one_b(p={p}, m={m})"
    stages = getattr(schedule, "stages", None)
    if stages is None or len(stages) != p:
        raise AssertionError(
            f"{where}: expected a Schedule with one program per stage ({p}), got {schedule!r}"
        )
    for s, prog in enumerate(stages):
        check_stage(where, s, p, m, list(prog))
    replay(where, [list(prog) for prog in stages])


def check_stage(where: str, s: int, p: int, m: int, prog: list) -> None:
    first, last = s == 0, s == p - 1
    flat = [ins for step in prog for ins in parts(step)]
    at = f"{where}, stage {s}: {program_text(prog)}\n  "
    needed = {
        FORWARD: True,
        BACKWARD: True,
        RECV_ACT: not first,
        SEND_GRAD: not first,
        SEND_ACT: not last,
        RECV_GRAD: not last,
    }
    for kind, wanted in needed.items():
        order = [ins.microbatch for ins in flat if ins.kind == kind]
        if not wanted and order:
            end = "first" if first else "last"
            raise AssertionError(
                f"{at}the {end} stage must not {kind.replace('_', ' ')} (there is no stage "
                f"{s - 1 if first else s + 1})"
            )
        if wanted and order != list(range(m)):
            raise AssertionError(
                f"{at}its {kind.replace('_', ' ')} steps are for microbatches {order}; expected "
                f"each of 0..{m - 1} once, in order"
            )
    pos = {(ins.kind, ins.microbatch): k for k, ins in enumerate(flat)}
    for i in range(m):
        before = [(FORWARD, BACKWARD)]
        before += [(RECV_ACT, FORWARD)] if not first else []
        before += [(FORWARD, SEND_ACT), (RECV_GRAD, BACKWARD)] if not last else []
        before += [(BACKWARD, SEND_GRAD)] if not first else []
        for a, b in before:
            if pos[(a, i)] > pos[(b, i)]:
                raise AssertionError(f"{at}{SHORT[a]}{i} must come before {SHORT[b]}{i}")
    live = peak = 0
    for ins in flat:
        live += {FORWARD: 1, BACKWARD: -1}.get(ins.kind, 0)
        peak = max(peak, live)
    limit = min(p - s, m)
    if peak > limit:
        raise AssertionError(
            f"{at}it holds the activations of {peak} microbatches at once; 1F1B holds at most "
            f"min(p - s, m) = {limit}. How many forwards does this stage run before its first "
            "backward, and how many does the handout's warm-up allow?"
        )
    for step in prog:
        if isinstance(step, Exchange) and any(ins.kind in (SEND_ACT, RECV_ACT) for ins in parts(step)):
            raise AssertionError(
                f"{at}its first activation message is inside an Exchange ({step}); it must be a "
                "plain instruction (the executor sends the shape header with it)"
            )
        if any(ins.kind in (SEND_ACT, RECV_ACT) for ins in parts(step)):
            break


def replay(where: str, progs: list[list]) -> None:
    """Run the programs with rendezvous messages; raise AssertionError naming where each stage waits."""
    p = len(progs)
    pos, done = [0] * p, [set() for _ in range(p)]
    while True:
        moved = False
        for s in range(p):
            while (
                pos[s] < len(progs[s])
                and isinstance(progs[s][pos[s]], Instruction)
                and progs[s][pos[s]].kind in (FORWARD, BACKWARD)
            ):
                pos[s] += 1
                moved = True
        for s in range(p):
            if pos[s] >= len(progs[s]):
                continue
            for k, ins in enumerate(parts(progs[s][pos[s]])):
                peer = s + OFFSET[ins.kind]
                if k in done[s] or not 0 <= peer < p or pos[peer] >= len(progs[peer]):
                    continue
                for k2, other in enumerate(parts(progs[peer][pos[peer]])):
                    if k2 in done[peer] or other.kind != MATCH[ins.kind] or peer + OFFSET[other.kind] != s:
                        continue
                    if other.microbatch != ins.microbatch:
                        raise AssertionError(
                            f"{where}: stage {s}'s {name(ins)} meets stage {peer}'s {name(other)}: "
                            "the data would go to the wrong microbatch"
                        )
                    done[s].add(k)
                    done[peer].add(k2)
                    moved = True
                    break
        for s in range(p):
            if pos[s] < len(progs[s]) and len(done[s]) == len(parts(progs[s][pos[s]])):
                pos[s] += 1
                done[s] = set()
                moved = True
        if all(pos[s] >= len(progs[s]) for s in range(p)):
            return
        if not moved:
            stuck = []
            for s in range(p):
                if pos[s] < len(progs[s]):
                    step = progs[s][pos[s]]
                    peers = sorted({s + OFFSET[i.kind] for i in parts(step)})
                    text = "+".join(name(i) for i in parts(step))
                    stuck.append(f"stage {s} waits at {text} (for stage {', '.join(map(str, peers))})")
            raise AssertionError(
                f"{where}: the schedule deadlocks with blocking (rendezvous) sends: "
                + "; ".join(stuck)
                + ". Where two neighbours would send to each other at the same time, make the send and the "
                "receive that follows it one Exchange (a sendrecv); a receive must never wait for a message "
                "its peer only sends after a receive of its own."
            )
