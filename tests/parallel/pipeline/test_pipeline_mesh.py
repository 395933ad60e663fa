"""PipelineParallel on a ProcessMesh equals one process: (dp, tp, pp) = (2, 1, 2), (1, 2, 2), (2, 2, 2).

The model is minidist.models.MLP, tensor-parallel when tp > 1 (column/row pairs), cut into pp stages;
its dense version with the same seed is the reference. Sharded parameters (tp_dim 0 or 1) are
reassembled from the tp ranks of a stage before the comparison; every dp replica is checked.
"""

from __future__ import annotations

import json

import numpy as np
import pp_common  # noqa: E402
import pytest
import tp_common  # noqa: E402
from mpi_utils import run_mpi  # noqa: E402

import minidist as md  # noqa: E402
from minidist import nn  # noqa: E402
from minidist.models import MLP  # noqa: E402

pytestmark = pytest.mark.mpi

# float64; as in test_pipeline_equivalence, only summation orders differ (here also the tp all-reduce
# of a row-parallel layer's partial sums), a few ulps per step: 1e-10 after 3 steps is a wide margin.
TOL = dict(rtol=1e-10, atol=1e-12)


def reference(seed: int, steps: int):
    md.manual_seed(seed)
    model = MLP(tp_common.N_IN, tp_common.HIDDEN, tp_common.N_CLASSES, dtype=np.float64)
    opt = pp_common.make_optimizer("sgd", model.parameters())
    x, y = tp_common.make_data(seed)
    losses = []
    for step in range(steps):
        xb, yb = tp_common.global_batch(x, y, step, pp_common.BATCH)
        loss = nn.functional.cross_entropy(model(md.tensor(xb, dtype=np.float64)), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model.state_dict(), losses


def check(tmp_path, world_size, configs):
    run_mpi(world_size, "pipeline/pp_mesh.py", tmp_path, json.dumps(configs), timeout=180)
    compare(tmp_path, world_size, configs)


def compare(tmp_path, world_size, configs):
    """Every rank's results of ``pp_mesh.py`` in ``tmp_path`` against the one-process reference (also used
    by tests/tools/cluster/test_cluster_training.py for the same runs across nodes)."""
    for k, cfg in enumerate(configs):
        ref, ref_losses = reference(cfg["seed"], cfg["steps"])
        shards: dict[tuple[str, int], dict[int, np.ndarray]] = {}  # (name, dp_rank) -> tp_rank -> shard
        tp_dims = {}
        for r in range(world_size):
            info = json.loads((tmp_path / f"{k}_rank{r}.json").read_text())
            np.testing.assert_allclose(info["losses"], ref_losses, **TOL, err_msg=f"{cfg} rank {r}")
            dp_rank, tp_rank, _ = info["coords"]
            tp_dims.update(info["tp_dims"])
            for name, value in np.load(tmp_path / f"{k}_rank{r}.npz").items():
                shards.setdefault((name, dp_rank), {})[tp_rank] = value
        assert sorted({name for name, _ in shards}) == sorted(ref), cfg
        for (name, dp_rank), by_tp in shards.items():
            assert sorted(by_tp) == list(range(cfg["tp"])), (cfg, name)
            dim = tp_dims[name]
            full = by_tp[0] if dim is None else np.concatenate([by_tp[t] for t in sorted(by_tp)], axis=dim)
            np.testing.assert_allclose(full, ref[name], **TOL, err_msg=f"{cfg}: {name}, dp replica {dp_rank}")
            if dim is None:  # a replicated parameter must be equal on every tp rank too
                for t in by_tp:
                    np.testing.assert_allclose(by_tp[t], ref[name], **TOL)


def configs(dp, tp, pp):
    return [
        dict(dp=dp, tp=tp, pp=pp, m=m, schedule=s, steps=3, seed=4) for m, s in ((4, "1f1b"), (3, "gpipe"))
    ]


def test_meshes_of_four_ranks(tmp_path):
    # interleaved: 9 layers in p * v = 4 chunks; with tp=2 a chunk may end inside a column/row pair
    interleaved = [dict(dp=dp, tp=tp, pp=2, m=4, schedule="interleaved", v=2, steps=3, seed=5)
                   for dp, tp in ((2, 1), (1, 2))]  # fmt: skip
    check(tmp_path, 4, configs(2, 1, 2) + configs(1, 2, 2) + interleaved)


def test_mesh_2x2x2_on_eight_ranks(tmp_path):
    check(tmp_path, 8, configs(2, 2, 2))
