"""The optimizers' and schedulers' argument checks are torch's: the values torch refuses are refused with
the same exception and message, and the values torch takes are taken (``lr=0`` freezes the parameters).

Two deliberate differences, each tested below:

- NaN fails every check. Each check is written ``not 0.0 <= value``, as torch's Adam writes its own (any
  comparison with NaN is False); torch's SGD writes ``value < 0.0`` and so takes a NaN ``lr``,
  ``momentum`` or ``weight_decay``, and its LinearLR a NaN factor, which make every parameter NaN at the
  first step. We refuse those with torch's message for the same argument.
- Values that torch takes at construction but crashes on at the first ``step()`` (``StepLR(step_size=0)``,
  ``CosineAnnealingLR(T_max=0)``) or silently misreads (decreasing ``SequentialLR`` milestones) are
  refused when the scheduler is built, with our own message.

The tests without torch pin the messages; the ones with torch (skipped where it is not installed) check
that the same values give torch's very messages.
"""

from __future__ import annotations

import copy
import inspect
import math
import pickle
import warnings

import numpy as np
import pytest

from minidist import nn, optim
from minidist.optim import lr_scheduler as sched

NAN, INF = math.nan, math.inf

# (optimizer, arguments, torch's message): what torch refuses, and so do we.
REFUSED = [
    ("SGD", {"lr": -1.0}, "Invalid learning rate: -1.0"),
    ("SGD", {"momentum": -0.5}, "Invalid momentum value: -0.5"),
    ("SGD", {"weight_decay": -1e-3}, "Invalid weight_decay value: -0.001"),
    ("SGD", {"nesterov": True}, "Nesterov momentum requires a momentum and zero dampening"),
    ("SGD", {"nesterov": True, "momentum": 0.9, "dampening": 0.1}, "Nesterov momentum requires a momentum"),
    ("SGD", {"lr": -1.0, "momentum": -1.0}, "Invalid learning rate: -1.0"),  # torch's order: lr first
    ("AdamW", {"lr": NAN}, "Invalid learning rate: nan"),
    ("AdamW", {"lr": -1e-3}, "Invalid learning rate: -0.001"),
    ("AdamW", {"eps": NAN}, "Invalid epsilon value: nan"),
    ("AdamW", {"eps": -1e-8}, "Invalid epsilon value: -1e-08"),
    ("AdamW", {"betas": (NAN, 0.999)}, "Invalid beta parameter at index 0: nan"),
    ("AdamW", {"betas": (0.9, NAN)}, "Invalid beta parameter at index 1: nan"),
    ("AdamW", {"betas": (1.0, 0.999)}, "Invalid beta parameter at index 0: 1.0"),
    ("AdamW", {"betas": (0.9, INF)}, "Invalid beta parameter at index 1: inf"),
    ("AdamW", {"betas": (-0.1, 0.999)}, "Invalid beta parameter at index 0: -0.1"),
    ("AdamW", {"weight_decay": NAN}, "Invalid weight_decay value: nan"),
    ("AdamW", {"weight_decay": -0.1}, "Invalid weight_decay value: -0.1"),
    ("AdamW", {"eps": -1.0, "betas": (1.0, 0.5)}, "Invalid epsilon value: -1.0"),  # eps before betas
]
# What torch takes, and so do we (inf is refused only where an interval ends below it: betas).
ACCEPTED = [
    ("SGD", {"lr": 0.0}),
    ("SGD", {"lr": INF}),
    ("SGD", {"momentum": INF}),
    ("SGD", {"dampening": -1.0}),  # torch has no check on dampening
    ("SGD", {"weight_decay": INF}),
    ("AdamW", {"lr": 0.0}),
    ("AdamW", {"lr": INF}),
    ("AdamW", {"eps": INF}),
    ("AdamW", {"weight_decay": INF}),
    ("AdamW", {"betas": (0.0, 0.0)}),
]
# NaN where torch's SGD does not look (``value < 0.0``): refused here, with torch's message for it.
SGD_NAN = [
    ({"lr": NAN}, "Invalid learning rate: nan"),
    ({"momentum": NAN}, "Invalid momentum value: nan"),
    ({"weight_decay": NAN}, "Invalid weight_decay value: nan"),
]


def ids(cases):
    return [f"{case[0]}-{case[1]}" for case in cases]


def ours(name: str, **kwargs):
    return getattr(optim, name)([nn.Parameter(np.ones(2))], **kwargs)


def theirs(torch, name: str, **kwargs):
    return getattr(torch.optim, name)([torch.nn.Parameter(torch.ones(2))], **kwargs)


# ------------------------------------------------------------------------------------------ optimizers
@pytest.mark.parametrize(("name", "kwargs", "message"), REFUSED, ids=ids(REFUSED))
def test_refused_values_raise_torchs_error(name, kwargs, message):
    with pytest.raises(ValueError) as info:
        ours(name, **kwargs)
    assert str(info.value).startswith(message)


@pytest.mark.parametrize(("name", "kwargs", "message"), REFUSED, ids=ids(REFUSED))
def test_torch_refuses_the_same_values_with_the_same_message(name, kwargs, message):
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError) as ours_info:
        ours(name, **kwargs)
    with pytest.raises(ValueError) as theirs_info:
        theirs(torch, name, **kwargs)
    assert str(ours_info.value) == str(theirs_info.value)
    assert str(theirs_info.value).startswith(message)


@pytest.mark.parametrize(("name", "kwargs"), ACCEPTED, ids=ids(ACCEPTED))
def test_values_torch_takes_are_taken(name, kwargs):
    ours(name, **kwargs)


@pytest.mark.parametrize(("name", "kwargs"), ACCEPTED, ids=ids(ACCEPTED))
def test_torch_takes_them_too(name, kwargs):
    theirs(pytest.importorskip("torch"), name, **kwargs)


@pytest.mark.parametrize("name", ["SGD", "AdamW"])
def test_a_zero_learning_rate_leaves_the_parameters_as_they_are(name):
    p = nn.Parameter(np.array([1.0, -2.0]))
    opt = getattr(optim, name)([p], lr=0.0)
    p.grad = np.array([0.5, 0.5])
    opt.step()
    np.testing.assert_array_equal(p.data, [1.0, -2.0])


@pytest.mark.parametrize(("kwargs", "message"), SGD_NAN, ids=[str(k) for k, _ in SGD_NAN])
def test_sgd_refuses_nan_with_torchs_message_for_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        ours("SGD", **kwargs)


@pytest.mark.parametrize(("kwargs", "message"), SGD_NAN, ids=[str(k) for k, _ in SGD_NAN])
def test_torch_sgd_takes_nan_and_steps_to_nan(kwargs, message):
    """Why we differ: torch takes it, and two steps (the first sets the momentum buffer) make the
    parameter NaN."""
    torch = pytest.importorskip("torch")
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], **{"lr": 0.1, "momentum": 0.5, **kwargs})
    for _ in range(2):
        p.grad = torch.ones(2)
        opt.step()
    assert torch.isnan(p).all()


def test_every_group_is_checked_too():
    """torch checks the constructor's arguments only; we check each group as well (its own values)."""
    a, b, c = (nn.Parameter(np.ones(2)) for _ in range(3))
    with pytest.raises(ValueError, match="^Invalid learning rate: nan$"):
        optim.SGD([{"params": [a]}, {"params": [b], "lr": NAN}], lr=0.1)
    with pytest.raises(ValueError, match="^Invalid beta parameter at index 1: 1.0$"):
        optim.AdamW([{"params": [a], "betas": (0.9, 1.0)}])
    opt = optim.SGD([a], lr=0.1)
    with pytest.raises(ValueError, match="^Invalid momentum value: -1.0$"):
        opt.add_param_group({"params": [c], "momentum": -1.0})
    assert len(opt.param_groups) == 1


def test_sgds_default_learning_rate_is_torchs():
    assert inspect.signature(optim.SGD).parameters["lr"].default == 1e-3
    torch = pytest.importorskip("torch")
    assert inspect.signature(torch.optim.SGD).parameters["lr"].default == 1e-3


# -------------------------------------------------------------------------------------------- defaults
def test_writing_defaults_warns_once_and_leaves_the_groups_alone():
    """The rate lives in param_groups, as in torch: defaults only fills in groups added later."""
    a, b = nn.Parameter(np.ones(2)), nn.Parameter(np.ones(2))
    opt = optim.SGD([a], lr=0.1)
    with pytest.warns(UserWarning, match=r"set group\['lr'\] for group in opt.param_groups"):
        opt.defaults["lr"] = 0.5
    assert opt.param_groups[0]["lr"] == 0.1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.defaults["momentum"] = 0.9  # once per optimizer
    opt.add_param_group({"params": [b]})
    assert (opt.param_groups[1]["lr"], opt.param_groups[1]["momentum"]) == (0.5, 0.9)
    with pytest.warns(UserWarning, match="add_param_group"):
        optim.AdamW([nn.Parameter(np.ones(2))]).defaults["lr"] = 1.0  # another optimizer: warns again


def test_copying_restoring_or_reading_defaults_does_not_warn():
    opt = optim.AdamW([nn.Parameter(np.ones(2))], lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        copied, unpickled = copy.deepcopy(opt), pickle.loads(pickle.dumps(opt))
        assert copied.defaults == unpickled.defaults == opt.defaults and copied.defaults["lr"] == 0.1
        opt.load_state_dict({"state": {}, "defaults": {"lr": 0.2}})  # the older layout
    assert opt.defaults["lr"] == opt.param_groups[0]["lr"] == 0.2
    with pytest.warns(UserWarning):  # a copy warns on its own first write
        copied.defaults["lr"] = 1.0


# ------------------------------------------------------------------------------------ load_state_dict
def _groups(lib, sizes: list[int]):
    """An SGD over ``len(sizes)`` groups of ``sizes[k]`` parameters, minidist's or torch's."""
    make = (lambda: nn.Parameter(np.ones(2))) if lib is None else (lambda: lib.nn.Parameter(lib.ones(2)))
    groups = [{"params": [make() for _ in range(n)]} for n in sizes]
    return (optim if lib is None else lib.optim).SGD(groups, lr=0.1)


MISFITS = [
    ([1], [1, 1], "loaded state dict has a different number of parameter groups", "(2 saved, 1 here)"),
    ([1, 1], [1, 2], "loaded state dict contains a parameter group that doesn't match the size of "
     "optimizer's group", "(group 1: 2 saved, 1 here)"),
]  # fmt: skip


@pytest.mark.parametrize(("here", "saved", "message", "numbers"), MISFITS, ids=["groups", "group-size"])
def test_a_state_of_other_groups_is_refused_with_torchs_message_and_the_numbers(
    here, saved, message, numbers
):
    opt = _groups(None, here)
    with pytest.raises(ValueError) as info:
        opt.load_state_dict(_groups(None, saved).state_dict())
    assert str(info.value).startswith(f"{message} {numbers}")
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match=f"^{message}$"):
        _groups(torch, here).load_state_dict(_groups(torch, saved).state_dict())


def test_a_state_without_state_is_a_key_error_as_in_torch():
    with pytest.raises(KeyError, match="'state'"):
        _groups(None, [1]).load_state_dict({"param_groups": _groups(None, [1]).state_dict()["param_groups"]})


# ------------------------------------------------------------------------------------------ schedulers
def _schedulers(lib):
    """Scheduler mistakes: name -> (build, exception class) for minidist's (lib None) or torch's."""
    s = sched if lib is None else lib.optim.lr_scheduler

    def opt():
        return _groups(lib, [1])

    one, other = opt(), opt()
    return {
        "not an optimizer": lambda: s.StepLR([1, 2], step_size=1),
        "lambdas per group": lambda: s.LambdaLR(one, [lambda t: 1.0, lambda t: 1.0]),
        "start factor 0": lambda: s.LinearLR(opt(), start_factor=0.0),
        "start factor 1.5": lambda: s.LinearLR(opt(), start_factor=1.5),
        "end factor -0.1": lambda: s.LinearLR(opt(), end_factor=-0.1),
        "end factor 2": lambda: s.LinearLR(opt(), end_factor=2.0),
        "no scheduler": lambda: s.SequentialLR(one, [], milestones=[]),
        "milestones": lambda: s.SequentialLR(one, [s.StepLR(one, 1)], milestones=[3]),
        "other optimizer": lambda: s.SequentialLR(
            one, [s.StepLR(one, 1), s.StepLR(other, 1)], milestones=[3]
        ),
    }


START = "Starting multiplicative factor expected to be greater than 0 and less or equal to 1."
END = "Ending multiplicative factor expected to be between 0 and 1."
SCHEDULER_MESSAGES = {
    "not an optimizer": (TypeError, "list is not an Optimizer"),
    "lambdas per group": (ValueError, "Expected 1 lr_lambdas, but got 2"),
    "start factor 0": (ValueError, START),
    "start factor 1.5": (ValueError, START),
    "end factor -0.1": (ValueError, END),
    "end factor 2": (ValueError, END),
    "no scheduler": (ValueError, "SequentialLR expects at least one scheduler, but got no scheduler."),
    "milestones": (
        ValueError,
        "Sequential Schedulers expects number of schedulers provided to be one more than the number of "
        "milestone points, but got number of schedulers 1 and the number of milestones to be equal to 1",
    ),
    "other optimizer": (  # then the optimizer's repr, which differs
        ValueError,
        "SequentialLR expects all schedulers to belong to the same optimizer, but got scheduler StepLR at "
        "index 1 has ",
    ),
}


@pytest.mark.parametrize("case", sorted(SCHEDULER_MESSAGES))
def test_scheduler_mistakes_raise_torchs_error(case):
    kind, message = SCHEDULER_MESSAGES[case]
    with pytest.raises(kind) as info:
        _schedulers(None)[case]()
    assert str(info.value).startswith(message)


@pytest.mark.parametrize("case", sorted(SCHEDULER_MESSAGES))
def test_torch_schedulers_raise_the_same(case):
    torch = pytest.importorskip("torch")
    kind, message = SCHEDULER_MESSAGES[case]
    with pytest.raises(kind) as info:
        _schedulers(torch)[case]()
    assert str(info.value).startswith(message)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda o: sched.LinearLR(o, start_factor=NAN), "Starting multiplicative factor expected"),
        (lambda o: sched.LinearLR(o, end_factor=NAN), "Ending multiplicative factor expected"),
        (lambda o: sched.StepLR(o, step_size=0), "StepLR: step_size must be >= 1, got 0"),
        (lambda o: sched.CosineAnnealingLR(o, T_max=0), "CosineAnnealingLR: T_max must be >= 1, got 0"),
        (lambda o: sched.LinearLR(o, total_iters=0), "LinearLR: total_iters must be >= 1, got 0"),
        (
            lambda o: sched.SequentialLR(o, [sched.StepLR(o, 1)] * 3, milestones=[5, 2]),
            r"SequentialLR: milestones must increase, got \[5, 2\]",
        ),
    ],
    ids=["nan-start", "nan-end", "step-size-0", "t-max-0", "total-iters-0", "decreasing-milestones"],
)
def test_values_torch_takes_but_cannot_use_are_refused_at_once(make, message):
    with pytest.raises(ValueError, match=message):
        make(_groups(None, [1]))


def test_torch_crashes_on_them_at_the_first_step():
    """What the refusals above spare a user: torch builds these schedulers, then fails in step()."""
    torch = pytest.importorskip("torch")
    s = torch.optim.lr_scheduler
    for make in (lambda o: s.StepLR(o, step_size=0), lambda o: s.CosineAnnealingLR(o, T_max=0)):
        scheduler = make(_groups(torch, [1]))
        scheduler.optimizer.step()  # (torch warns if the scheduler steps first)
        with pytest.raises(ZeroDivisionError):
            scheduler.step()
