"""``minidist.distributed.safety.agreement``: every rank raises the same error, naming which ranks differ and
how.

The cases are drawn by hypothesis in this process (values and errors per rank), run by real MPI ranks
in one launch (tests/workers/distributed/agreement_check.py), and the expected outcome is computed here
from the same rule the library documents: the lowest rank with an error decides; else differing values
are a ValueError listing each field's value per rank.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi_utils import run_mpi

from minidist.distributed.safety.agreement import describe_differences

N = 4
ERROR_KINDS = ["TypeError", "ValueError", "LocalOnlyError"]
values_st = st.fixed_dictionaries({"n": st.sampled_from([8, 12]), "flag": st.booleans()})
error_st = st.none() | st.tuples(st.sampled_from(ERROR_KINDS), st.text("abc xyz", min_size=1, max_size=8))


def expected(case: dict, size: int) -> tuple[str, str]:
    """(exception class name, a fragment of the message) that every rank of the case must raise."""
    ranks = case["ranks"][:size]
    for rank, r in enumerate(ranks):
        if r["error"] is not None:
            kind, message = r["error"]
            if kind == "LocalOnlyError":  # not rebuildable by name: a RuntimeError on every rank
                return "RuntimeError", f"rank {rank} of the test group: LocalOnlyError: {message}"
            return kind, f"rank {rank} of the test group: {message}"
    difference = describe_differences([r["values"] for r in ranks])
    if difference is None:
        return "ok", ""
    return "ValueError", f"Case: the ranks of the test group passed different values: {difference}; fix it"


@st.composite
def cases_st(draw):
    cases = {}
    for i in range(draw(st.integers(4, 8))):
        ranks = [{"values": draw(values_st), "error": draw(error_st)} for _ in range(N)]
        cases[f"case{i}"] = {"ranks": ranks, "group": draw(st.sampled_from(["world", "even"]))}
    return cases


FIXED = {  # the outcomes a reader checks by eye
    "same": {"ranks": [{"values": {"n": 8}, "error": None}] * N},
    "rank 2 differs": {"ranks": [{"values": {"n": 8 if r != 2 else 12}, "error": None} for r in range(N)]},
    "errors on ranks 1 and 3": {
        "ranks": [
            {"values": {"n": 8}, "error": None if r in (0, 2) else ["TypeError", f"bad {r}"]}
            for r in range(N)
        ]
    },
}


@pytest.mark.mpi
@settings(max_examples=2, deadline=None)
@given(drawn=cases_st())
def test_every_rank_raises_the_same_error(tmp_path_factory, drawn):
    tmp = tmp_path_factory.mktemp("agree")
    cases = {**FIXED, **drawn}
    (tmp / "cases.json").write_text(json.dumps(cases))
    run_mpi(N, "distributed/agreement_check.py", tmp / "cases.json", tmp, timeout=60)
    seen = [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(N)]
    assert seen[0]["same"] == ["ok", ""]
    assert seen[0]["rank 2 differs"][1] == (
        "Case: the ranks of the test group passed different values: "
        "n (8 on ranks 0, 1, 3; 12 on rank 2); fix it"
    )
    assert seen[0]["errors on ranks 1 and 3"] == ["TypeError", "rank 1 of the test group: bad 1"]
    for name, case in cases.items():
        size = N // 2 if case.get("group") == "even" else N
        members = range(0, N, 2) if case.get("group") == "even" else range(N)
        kind, fragment = expected({**case, "ranks": [case["ranks"][m] for m in members]}, size)
        for rank in members:
            got_kind, got_message = seen[rank][name]
            assert got_kind == kind, (name, rank, seen[rank][name])
            assert fragment in got_message, (name, rank, got_message, fragment)
            assert seen[rank][name] == seen[members[0]][name], "ranks raised different errors"
    for rank in range(N):
        kind, message = seen[rank]["unencodable all_gather_json"]
        assert kind == "TypeError" and f"rank {N - 1} could not write its object as JSON" in message
        kind, message = seen[rank]["unencodable agree"]
        assert kind == "TypeError" and f"rank {N - 1} of the test group: Case: these values cannot" in message
        assert seen[rank]["after"] == [N, N, N]  # the exchange left no message behind
        gathered = seen[rank]["all_gather_json"]
        assert [g["rank"] for g in gathered] == list(range(N))
        assert [len(g["text"]) for g in gathered] == [37 * r for r in range(N)]
        assert gathered[0]["odd"] == "{1, 2}" and gathered[1]["odd"] is None


@given(
    st.lists(st.fixed_dictionaries({"a": st.integers(0, 2), "b": st.sampled_from(["x", "y"])}), min_size=1)
)
def test_describe_differences_names_each_differing_field_and_its_ranks(everyone):
    text = describe_differences(everyone)
    for field in ("a", "b"):
        values = [d[field] for d in everyone]
        if len(set(values)) == 1:
            assert text is None or f"{field} (" not in text
            continue
        for value in set(values):
            ranks = [r for r, v in enumerate(values) if v == value]
            where = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
            assert f"{value} on {where}" in text
    if all(d == everyone[0] for d in everyone):
        assert text is None


def test_a_missing_field_is_shown_as_missing():
    assert describe_differences([{"a": 1}, {}]) == "a (1 on rank 0; <missing> on rank 1)"
