"""Checkpoints of uneven, strided and tied tensors: saved on tp 2, loaded on tp 1, 3, 4, back.

One 4-rank launch of ``workers/checkpoint/ckpt_reshard.py`` runs every layout (see its docstring);
the toy model (``workers/reshard_common.py``) has an uneven "vocabulary" (7 rows), attention-like
[q; k; v] tensors with ``tp_stride`` 3, a row-parallel weight and a replicated bias. Every layout's
parameters and AdamW moments must be split.py's pieces of the full tensors that one process computes
with the same step: copies, never arithmetic, so the comparisons are exact.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import reshard_common as R  # noqa: E402
from hypothesis import given
from hypothesis import strategies as st
from mpi_utils import run_mpi

from minidist import checkpoint
from minidist.checkpoint.layout import Layout, assign_writers
from minidist.parallel.tensor_parallel.split import shard_bounds
from minidist_cli import main as cli_main


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("reshard")
    (root / "out").mkdir()
    run_mpi(4, "checkpoint/ckpt_reshard.py", root / "ckpt", root / "out", timeout=180)
    return root


def dumps(run, name: str, tp: int) -> list[dict[str, np.ndarray]]:
    return [dict(np.load(run / "out" / f"{name}_r{r}.npz")) for r in range(tp)]


@pytest.mark.mpi
@pytest.mark.parametrize(
    "name, tp",
    [
        ("load_tp1", 1),
        ("load_tp3", 3),
        ("load_tp4", 4),
        ("back_tp2", 2),
        ("from_cp2_tp2", 2),
        ("zero_to_tp3", 3),
    ],
)
def test_every_layout_holds_the_split_rules_pieces_of_the_full_tensors(run, name, tp):
    # The saving layout's own pieces first: the step on pieces is the step on the full tensors.
    full = R.full_after_step()
    for layout, size in (("save_tp2", 2), (name, tp)):
        for r, got in enumerate(dumps(run, layout, size)):
            for key, want in full.items():
                np.testing.assert_array_equal(
                    got[key], R.piece(key.split("/")[0], want, size, r), f"{layout} {key}"
                )
                assert got[key.split("/")[0] + "/step"] == 1


@pytest.mark.mpi
def test_same_layout_resume_is_bit_exact_and_restores_the_generators(run):
    for saved, loaded in zip(dumps(run, "save_tp2", 2), dumps(run, "load_tp2", 2)):
        assert saved.keys() == loaded.keys()
        for key in saved:
            np.testing.assert_array_equal(loaded[key], saved[key], key)
    info = json.loads((run / "out" / "info.json").read_text())
    assert info["load_tp2"] == {"resharded": False, "rng_restored": True}
    assert info["load_tp3"]["resharded"] and info["load_tp1"]["resharded"]


@pytest.mark.mpi
def test_manifest_records_the_full_shapes_strides_and_cp(run):
    manifest = json.loads((run / "ckpt" / "a" / "step_000000001" / "manifest.json").read_text())
    assert manifest["format_version"] == 2 and manifest["mesh"]["cp"] == 1
    t = manifest["tensors"]
    assert t["model/emb.weight"]["global_shape"] == [7, 3]  # 4 + 3 rows: the sum of the pieces
    assert [s["shape"] for s in t["model/emb.weight"]["shards"]] == [[4, 3], [3, 3]]
    assert t["model/attn.weight"]["tp_stride"] == 3 and t["model/attn.weight"]["global_shape"] == [12, 5]
    assert t["optim/proj.weight/exp_avg"]["global_shape"] == [5, 6]
    b = json.loads((run / "ckpt" / "b" / "step_000000001" / "manifest.json").read_text())["tensors"]
    assert [s["shape"][1] for s in b["model/proj.weight"]["shards"]] == [2, 2, 2]
    assert [s["shape"][0] for s in b["model/emb.weight"]["shards"]] == [3, 2, 2]


@pytest.mark.mpi
def test_cli_shows_the_full_shapes_of_uneven_pieces(run, capsys):
    assert cli_main(["checkpoint", "info", str(run / "ckpt" / "b"), "--verify"]) == 0
    out = capsys.readouterr().out
    assert "tp=3 pp=1 cp=1" in out and "all files match" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith(("model/", "optim/"))}
    assert "7x3" in lines["model/emb.weight"] and lines["model/emb.weight"].endswith("3 (3+2+2)")
    assert "12x5" in lines["model/attn.weight"] and "0/s3" in lines["model/attn.weight"]


@pytest.mark.mpi
def test_a_tied_copy_is_not_saved_and_is_filled_from_its_original_on_load(run):
    folder = run / "ckpt" / "c" / "step_000000001"
    manifest = json.loads((folder / "manifest.json").read_text())
    emb = manifest["tensors"]["model/emb.weight"]
    assert [s["file"] for s in emb["shards"]] == ["rank00000.safetensors"]  # stage 0 only, once
    keys = [k for k in manifest["tensors"] if "emb.weight" in k]
    assert sorted(keys) == ["model/emb.weight", "optim/emb.weight/exp_avg", "optim/emb.weight/exp_avg_sq"]
    full = R.full_after_step()
    first, last = (dict(np.load(run / "out" / f"tied_r{s}.npz")) for s in (0, 1))
    for key in ("emb.weight", "emb.weight/exp_avg", "emb.weight/exp_avg_sq"):
        np.testing.assert_array_equal(first[key], full[key], key)
        np.testing.assert_array_equal(last[key], full[key], key)  # the copy, from the original's tensors
    assert last["emb.weight/step"] == 1
    np.testing.assert_array_equal(last["proj.bias"], full["proj.bias"])


@pytest.mark.mpi
def test_context_parallel_ranks_share_the_writing_and_resume_exactly(run):
    manifest = json.loads((run / "ckpt" / "d" / "step_000000001" / "manifest.json").read_text())
    assert manifest["mesh"] == {"dp": 1, "tp": 1, "pp": 1, "cp": 2, "world_size": 2}
    assert [r["coords"] for r in manifest["ranks"]] == [[0, 0, 0, 0], [0, 0, 0, 1]]
    assert sorted(manifest["files"]) == ["rank00000.safetensors", "rank00001.safetensors"]  # both write
    full = R.full_after_step()
    for r in range(2):
        got = dict(np.load(run / "out" / f"load_cp2_r{r}.npz"))
        for key, want in full.items():
            np.testing.assert_array_equal(got[key], want, key)
    info = json.loads((run / "out" / "info.json").read_text())
    assert info["load_cp2"] == {"resharded": False, "rng_restored": True}


@pytest.mark.mpi
def test_pieces_that_split_py_did_not_cut_are_refused_on_save_and_load(run):
    info = json.loads((run / "out" / "info.json").read_text())
    assert "'model/emb.weight'" in info["wrong_save"] and "[[3, 3], [4, 3]]" in info["wrong_save"]
    assert (
        "tp rank 0 of 2" in info["wrong_load"]
        and "is [4, 3], but this rank holds [3, 3]" in info["wrong_load"]
    )
    assert not (run / "ckpt" / "e" / "step_000000001").exists()


# -- single process: the format-1 reader and the writer assignment ---------------------------------
def test_a_format_1_checkpoint_still_loads_and_resumes_exactly(tmp_path):
    # A format-1 manifest, as older minidist writes it: no tp_stride, no cp, 3 coordinates per rank.
    model = R.build(1, 0)
    opt = R.adamw(model)
    R.step(model, opt, 1, 0)
    folder = checkpoint.save(tmp_path, model, opt, step=1)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["format_version"] = 1
    del manifest["mesh"]["cp"]
    for t in manifest["tensors"].values():
        del t["tp_stride"]
    for r in manifest["ranks"]:
        r["coords"] = r["coords"][:3]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    fresh = R.build(1, 0, zero=True)
    fresh_opt = R.adamw(fresh)
    info = checkpoint.load(tmp_path, fresh, fresh_opt)
    assert info["rng_restored"] and not info["resharded"]  # the same layout: cp 1 is what v1 meant
    saved, got = R.dump(model, opt), R.dump(fresh, fresh_opt)
    for key in saved:
        np.testing.assert_array_equal(got[key], saved[key], key)


@given(
    dp=st.integers(1, 2), cp=st.integers(1, 3), tp=st.integers(1, 4), pp_rank=st.integers(0, 1),
    rows=st.integers(1, 9), sizes=st.lists(st.integers(1, 50), min_size=1, max_size=4),
)  # fmt: skip
def test_writers_are_chosen_among_the_dp_and_cp_replicas_of_each_uneven_piece(
    dp, cp, tp, pp_rank, rows, sizes
):
    layout = Layout(0, dp * cp * tp * 2, dp, tp, 2, 0, 0, pp_rank, cp, 0)
    pieces = [len(range(*shard_bounds(rows, tp, t))) * 8 for t in range(tp)]  # uneven row counts
    items = [("emb", pieces, 0)] + [(f"r{i}", n, None) for i, n in enumerate(sizes)]
    writers = assign_writers(items, layout)
    per_stage = dp * cp * tp
    assert set(writers) == {("emb", t) for t in range(tp)} | {(f"r{i}", None) for i in range(len(sizes))}
    loads: dict[int, int] = {}
    for (key, t), rank in writers.items():
        assert rank // per_stage == pp_rank  # a rank of this stage (tp fastest, then cp, dp, pp)
        assert t is None or rank % tp == t  # a piece by a replica that holds it
        loads[rank] = loads.get(rank, 0) + (pieces[t] if key == "emb" else sizes[int(key[1:])])
    # Balanced by each piece's own size: no writer above the ideal share by more than the largest item.
    assert max(loads.values()) <= (sum(pieces) + sum(sizes)) / per_stage + max(pieces + sizes)
