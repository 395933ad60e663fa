"""MPI worker for ``minidist.distributed.safety.agreement``: each rank plays its part of every case, records
what it raised, and the test checks that every rank raised the same thing.

Usage: ``mpiexec -n N python agreement_check.py CASES_JSON OUT_DIR``. Each case gives, per rank, the values
it passes and the error it has (None, or [class name, message]); ``"group": "even"`` runs the case on
the sub-group of even world ranks only (the odd ranks skip it).
"""

from __future__ import annotations

import json
import sys

import numpy as np
from dist_worker_utils import run_worker, write_json

import minidist.distributed as dist


class LocalOnlyError(Exception):
    """A class only the failing rank knows about: the others cannot rebuild it."""


ERRORS = {"TypeError": TypeError, "ValueError": ValueError, "LocalOnlyError": LocalOnlyError}


def main(cases_path: str, out_dir: str) -> None:
    world = dist.init()
    even = world.split(color=world.rank % 2, key=world.rank)
    cases = json.loads(open(cases_path).read())
    seen = {}
    for name, case in cases.items():
        group = even if case.get("group") == "even" else world
        if case.get("group") == "even" and world.rank % 2:
            continue
        mine = case["ranks"][world.rank]  # the entry of this world rank (the test maps group ranks)
        error = None if mine["error"] is None else ERRORS[mine["error"][0]](mine["error"][1])
        try:
            dist.agree(mine["values"], error, group, what="Case", label="test group", fix="fix it")
            seen[name] = ["ok", ""]
        except Exception as e:  # noqa: BLE001  (recording what was raised is the point)
            seen[name] = [type(e).__name__, str(e)]
    # all_gather_json: a different length on every rank, and a value JSON cannot encode (a tuple
    # key is not valid JSON, a set is not): it travels as its str().
    payload = {
        "rank": world.rank,
        "text": "x" * (world.rank * 37),
        "odd": {1, 2} if world.rank == 0 else None,
    }
    seen["all_gather_json"] = dist.all_gather_json(payload, world)
    # Values JSON cannot write at all, on the last rank only: every rank must raise, and the next
    # collective must still pair with the next collective (nothing left half-exchanged).
    circular: list = []
    if world.rank == world.size - 1:
        circular.append(circular)
    for name, call in (
        ("unencodable all_gather_json", lambda: dist.all_gather_json({"x": circular}, world)),
        (
            "unencodable agree",
            lambda: dist.agree({"x": circular}, None, world, what="Case", label="test group"),
        ),
    ):
        try:
            call()
            seen[name] = ["ok", ""]
        except Exception as e:  # noqa: BLE001
            seen[name] = [type(e).__name__, str(e)]
    seen["after"] = dist.all_reduce(np.ones(3), op="sum").tolist()
    write_json(out_dir, f"rank{world.rank}.json", seen)


if __name__ == "__main__":
    run_worker(main, *sys.argv[1:])
