"""Parameter groups and learning-rate schedulers as in PyTorch, checked against
PyTorch itself in float64 (skipped where torch is not installed): the same schedules step by step,
the same updates per group, and a small MLP trained with all of it together."""

from __future__ import annotations

import numpy as np
import pytest

import minidist as md
from minidist import nn, optim
from minidist.nn import functional as F
from minidist.optim import lr_scheduler as sched

torch = pytest.importorskip("torch")

# (our constructor, torch's constructor), each taking an optimizer.
SCHEDULES = {
    "lambda": (
        lambda o: sched.LambdaLR(o, lambda t: 0.9**t + 0.1 * (t % 3)),
        lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda t: 0.9**t + 0.1 * (t % 3)),
    ),
    "step": (
        lambda o: sched.StepLR(o, step_size=3, gamma=0.5),
        lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5),
    ),
    "linear": (
        lambda o: sched.LinearLR(o, start_factor=0.1, end_factor=0.8, total_iters=7),
        lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=0.1, end_factor=0.8, total_iters=7),
    ),
    "cosine": (
        lambda o: sched.CosineAnnealingLR(o, T_max=9, eta_min=1e-3),
        lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=9, eta_min=1e-3),
    ),
    "cosine_with_warmup": (
        lambda o: sched.cosine_with_warmup(
            o, warmup_steps=4, total_steps=15, eta_min=1e-3, start_factor=0.01
        ),
        lambda o: torch.optim.lr_scheduler.SequentialLR(
            o,
            [
                torch.optim.lr_scheduler.LinearLR(o, start_factor=0.01, total_iters=4),
                torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=11, eta_min=1e-3),
            ],
            milestones=[4],
        ),
    ),
}


def _two_groups(lib, params):
    """Two groups with their own lr (and momentum for the first), as a torch user writes them."""
    return lib.optim.SGD(
        [{"params": params[:1], "lr": 0.3, "momentum": 0.5}, {"params": params[1:]}], lr=0.1, momentum=0.9
    )


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_schedule_matches_torch_step_by_step_for_every_group(name):
    ours_make, theirs_make = SCHEDULES[name]
    ours_opt = _two_groups(md, [nn.Parameter(np.zeros(2)), nn.Parameter(np.zeros(3))])
    theirs_opt = _two_groups(torch, [torch.zeros(2, requires_grad=True), torch.zeros(3, requires_grad=True)])
    ours, theirs = ours_make(ours_opt), theirs_make(theirs_opt)
    for step in range(25):
        expected = [g["lr"] for g in theirs_opt.param_groups]
        np.testing.assert_allclose(
            [g["lr"] for g in ours_opt.param_groups], expected, rtol=1e-12, err_msg=step
        )
        np.testing.assert_allclose(ours.get_last_lr(), theirs.get_last_lr(), rtol=1e-12)
        theirs_opt.step()
        ours.step()
        theirs.step()


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_scheduler_state_dict_resumes_the_same_schedule(name):
    make = SCHEDULES[name][0]
    opt = optim.SGD([nn.Parameter(np.zeros(2))], lr=0.1)
    scheduler = make(opt)
    for _ in range(6):
        scheduler.step()
    saved_opt, saved = opt.state_dict(), scheduler.state_dict()
    rest = [scheduler.step() or scheduler.get_last_lr() for _ in range(8)]

    opt2 = optim.SGD([nn.Parameter(np.zeros(2))], lr=0.1)
    resumed = make(opt2)
    opt2.load_state_dict(saved_opt)
    resumed.load_state_dict(saved)
    assert [resumed.step() or resumed.get_last_lr() for _ in range(8)] == rest


def test_scheduler_arguments_are_checked():
    opt = optim.SGD([nn.Parameter(np.zeros(2))], lr=0.1)
    with pytest.raises(ValueError, match="step_size must be >= 1"):
        sched.StepLR(opt, step_size=0)
    with pytest.raises(ValueError, match="1 <= warmup_steps < total_steps, got 10, 10"):
        sched.cosine_with_warmup(opt, warmup_steps=10, total_steps=10)
    with pytest.raises(TypeError, match="list is not an Optimizer"):
        sched.StepLR([nn.Parameter(np.zeros(2))], step_size=1)


@pytest.mark.parametrize("opt_name", ["SGD", "AdamW"])
def test_param_groups_update_each_group_with_its_own_values_as_torch(opt_name):
    rng = np.random.default_rng(0)
    values = [rng.standard_normal(s) for s in [(3, 2), (2,), (4,)]]
    grads = [[rng.standard_normal(v.shape) for v in values] for _ in range(4)]
    extra = {"SGD": dict(momentum=0.9, nesterov=True), "AdamW": dict(betas=(0.8, 0.99))}[opt_name]
    results = []
    for lib, make in [
        (md, lambda v: nn.Parameter(v.copy())),
        (torch, lambda v: torch.tensor(v, requires_grad=True)),
    ]:
        ps = [make(v) for v in values]
        groups = [{"params": ps[:2], "lr": 0.05, "weight_decay": 0.1}, {"params": [ps[2]]}]
        opt = getattr(lib.optim, opt_name)(groups, lr=0.2, **extra)
        for step_grads in grads:
            for p, g in zip(ps, step_grads):
                p.grad = g.copy() if lib is md else torch.tensor(g)
            opt.step()
        results.append([p.data if lib is md else p.detach().numpy() for p in ps])
        assert [g["lr"] for g in opt.param_groups] == [0.05, 0.2]
    for ours, theirs in zip(*results):
        np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-14)


def test_optimizer_state_dict_has_torchs_layout_and_restores_scheduled_rates():
    ps = [nn.Parameter(np.ones(2)), nn.Parameter(np.ones(3))]
    opt = _two_groups(md, ps)
    opt.param_groups[1]["lr"] = 0.01  # what a scheduler does
    sd = opt.state_dict()
    assert [g["params"] for g in sd["param_groups"]] == [[0], [1]]
    assert [g["lr"] for g in sd["param_groups"]] == [0.3, 0.01]
    fresh = _two_groups(md, [nn.Parameter(np.ones(2)), nn.Parameter(np.ones(3))])
    fresh.load_state_dict(sd)
    assert [g["lr"] for g in fresh.param_groups] == [0.3, 0.01]
    with pytest.raises(ValueError, match=r"different number of parameter groups \(2 saved, 1 here\)"):
        optim.SGD([nn.Parameter(np.ones(2)), nn.Parameter(np.ones(3))], lr=0.1).load_state_dict(sd)


def test_param_group_mistakes_are_named():
    a, b = nn.Parameter(np.ones(2)), nn.Parameter(np.ones(2))
    with pytest.raises(ValueError, match="more than one parameter group"):
        optim.SGD([{"params": [a, b]}, {"params": [b]}], lr=0.1)
    with pytest.raises(ValueError, match='must be a dict with a "params" key'):
        optim.SGD([{"params": [a]}, {"lr": 0.1}], lr=0.1)
    with pytest.raises(ValueError, match="Nesterov momentum requires a momentum and zero dampening"):
        optim.SGD([{"params": [a], "momentum": 0.0}], lr=0.1, momentum=0.9, nesterov=True)
    with pytest.raises(ValueError, match="Invalid learning rate: -1"):
        optim.AdamW([{"params": [a], "lr": -1}])


def test_mlp_training_with_groups_scheduler_and_label_smoothing_matches_torch():
    """The whole loop a PyTorch user writes, for 12 steps in float64: every parameter to 1e-12."""
    md.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16, dtype=np.float64), nn.GELU(), nn.Linear(16, 4, dtype=np.float64))
    reference = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).double()
    reference.load_state_dict({k: torch.tensor(v) for k, v in model.state_dict().items()})
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((12, 6)), rng.integers(0, 4, size=12)
    y[::5] = -100  # padding targets, ignored

    def setup(lib, m):
        params = list(m.parameters())
        groups = [{"params": params[:2], "lr": 0.2}, {"params": params[2:], "weight_decay": 1e-2}]
        opt = lib.optim.SGD(groups, lr=0.1, momentum=0.9)
        if lib is md:
            return opt, sched.cosine_with_warmup(opt, warmup_steps=3, total_steps=12, start_factor=0.1)
        warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=3)
        cos = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=9)
        return opt, torch.optim.lr_scheduler.SequentialLR(opt, [warm, cos], milestones=[3])

    (opt, scheduler), (ref_opt, ref_scheduler) = setup(md, model), setup(torch, reference)
    for step in range(12):
        loss = F.cross_entropy(model(md.tensor(x, dtype=np.float64)), y, label_smoothing=0.1)
        ref_loss = torch.nn.functional.cross_entropy(
            reference(torch.tensor(x)), torch.tensor(y), label_smoothing=0.1
        )
        np.testing.assert_allclose(loss.numpy(), ref_loss.item(), rtol=1e-12, err_msg=f"step {step}")
        opt.zero_grad()
        ref_opt.zero_grad()
        loss.backward()
        ref_loss.backward()
        opt.step()
        ref_opt.step()
        scheduler.step()
        ref_scheduler.step()
    for name, value in model.state_dict().items():
        np.testing.assert_allclose(value, reference.state_dict()[name].numpy(), rtol=1e-12, atol=1e-14)


def test_checkpoint_resume_keeps_the_scheduled_rates_of_every_group(tmp_path):
    """A run resumed from ``minidist.checkpoint`` continues with the rates the scheduler had set, not
    the constructor's (the scheduler's own state travels in ``extra=``, as torch users save it)."""
    from minidist import checkpoint

    def build():
        md.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 4, dtype=np.float64), nn.Tanh(), nn.Linear(4, 2, dtype=np.float64))
        params = list(model.parameters())
        opt = optim.SGD([{"params": params[:2], "lr": 0.3}, {"params": params[2:]}], lr=0.1, momentum=0.9)
        return model, opt, sched.cosine_with_warmup(opt, warmup_steps=2, total_steps=10)

    x, y = np.random.default_rng(0).standard_normal((8, 3)), np.arange(8) % 2

    def train(model, opt, scheduler, steps):
        for _ in range(steps):
            opt.zero_grad()
            F.cross_entropy(model(md.tensor(x, dtype=np.float64)), y).backward()
            opt.step()
            scheduler.step()

    model, opt, scheduler = build()
    train(model, opt, scheduler, 4)
    checkpoint.save(tmp_path, model, opt, step=4, extra={"scheduler": scheduler.state_dict()})
    train(model, opt, scheduler, 3)

    model2, opt2, scheduler2 = build()
    info = checkpoint.load(tmp_path, model2, opt2)
    scheduler2.load_state_dict(info["extra"]["scheduler"])
    train(model2, opt2, scheduler2, 3)
    assert [g["lr"] for g in opt2.param_groups] == [g["lr"] for g in opt.param_groups]
    for name, value in model2.state_dict().items():
        np.testing.assert_array_equal(value, model.state_dict()[name])


def test_checkpoint_with_other_parameter_groups_is_refused_before_anything_changes(tmp_path):
    from minidist import checkpoint
    from minidist.checkpoint import CheckpointError

    md.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4, dtype=np.float64), nn.Linear(4, 2, dtype=np.float64))
    params = list(model.parameters())
    checkpoint.save(
        tmp_path, model, optim.SGD([{"params": params[:2]}, {"params": params[2:]}], lr=0.1), step=1
    )
    md.manual_seed(1)
    other = nn.Sequential(nn.Linear(3, 4, dtype=np.float64), nn.Linear(4, 2, dtype=np.float64))
    before = other.state_dict()
    with pytest.raises(CheckpointError, match="has 2 parameter groups, this one 1; build the optimizer"):
        checkpoint.load(tmp_path, other, optim.SGD(other.parameters(), lr=0.1))
    for name, value in other.state_dict().items():
        np.testing.assert_array_equal(value, before[name])


INITIAL_LR = {"SGD": 0.2, "AdamW": 0.05}  # as in tests/workers/habits/zero_schedule.py


@pytest.mark.mpi
@pytest.mark.parametrize("stage, opt_name", [(1, "SGD"), (2, "AdamW")])
def test_zero_follows_a_scheduler_like_one_process(tmp_path, stage, opt_name):
    """2 real ranks: a scheduler drives ``ZeroRedundancyOptimizer.param_groups`` and training matches
    a plain optimizer with the same schedule on one process."""
    import json

    from mpi_utils import run_mpi

    run_mpi(2, "habits/zero_schedule.py", tmp_path, stage, opt_name, timeout=180)
    for rank in range(2):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result["zero_lrs"] == result["ref_lrs"] and result["zero_lrs"][0] < INITIAL_LR[opt_name]
        assert result["max_diff"] < 1e-12, result
