"""MPI worker: every documented FSDP error, raised on every rank (each case caught and recorded).

Usage: ``mpiexec -n N python fsdp_errors.py OUT_DIR``; writes ``rank<r>.json``: case -> [exception class
name, message] (or None if nothing was raised). Several cases are wrong on rank 1 only: the collective
checks must still raise on every rank, instead of leaving rank 0 waiting in a collective.
"""

from __future__ import annotations

import sys

import fsdp_common as fc
import numpy as np
from dist_worker_utils import run_worker, write_json

import minidist as md
import minidist.distributed as dist
from minidist import nn, optim
from minidist.models import GPT, GPTConfig
from minidist.models.gpt.transformer import Block
from minidist.parallel import FullyShardedDataParallel as FSDP


def caught(fn) -> list[str] | None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001  (recorded for the test to judge)
        return [type(e).__name__, str(e)]
    return None


class TwoOutputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2, dtype=np.float64)

    def forward(self, x):
        y = self.lin(x)
        return y, y


def main(out_dir: str) -> None:
    world = dist.init()
    odd = world.rank == 1  # the rank that passes something different
    gpt = fc.make_gpt
    config = {**fc.GPT_CONFIG, "n_embd": 24 if odd else 16}
    results = {
        "shape_differs_on_one_rank": caught(lambda: FSDP(GPT(GPTConfig(**config)), wrap=(Block,))),
        "wrap_selects_nothing": caught(lambda: FSDP(gpt(1), wrap=lambda name, module: False)),
        "nested_units": caught(lambda: FSDP(gpt(1), wrap=(Block, nn.Linear))),
        "bad_wrap_type": caught(lambda: FSDP(gpt(1), wrap="Block")),
        "param_dtype_on_one_rank": caught(lambda: FSDP(gpt(1), param_dtype="int8" if odd else None)),
        "prefetch_differs": caught(lambda: FSDP(gpt(1), wrap=(Block,), prefetch=not odd)),
    }
    fsdp = FSDP(gpt(1), wrap=(Block,))
    results["wrapped_twice"] = caught(lambda: FSDP(fsdp.module, wrap=(Block,)))
    ids = np.zeros((2, 4), dtype=np.int64)
    fsdp(ids).sum().backward()
    results["clip_max_norm_differs"] = caught(lambda: fsdp.clip_grad_norm_(2.0 if odd else 1.0))
    state = fsdp.state_dict()
    state["wpe.weight"] = state["wpe.weight"][:-1]
    results["load_wrong_shape"] = caught(lambda: fsdp.load_state_dict(state))
    results["load_missing_key"] = caught(lambda: fsdp.load_state_dict({"wte.weight": state["wte.weight"]}))
    results["foreign_parameter_in_groups"] = caught(
        lambda: fsdp.shard_param_groups([{"params": [nn.Parameter(np.zeros(3))]}])
    )

    def backward_twice():
        loss = fsdp(ids).sum()
        loss.backward()
        loss.backward()

    results["backward_twice"] = caught(backward_twice)

    def summon_nested():
        with fsdp.summon_full_params(), fsdp.summon_full_params():
            pass

    def forward_inside_summon():
        with fsdp.summon_full_params():
            fsdp(ids)

    results["summon_nested"] = caught(summon_nested)
    results["forward_inside_summon"] = caught(forward_inside_summon)
    with fsdp.summon_full_params():  # the module itself runs plainly inside, with the full weights
        inside = fsdp.module(ids).numpy()
    with md.no_grad():
        outside = fsdp(ids).numpy()
    results["summoned_module_equals_fsdp"] = bool(np.array_equal(inside, outside))
    two = FSDP(TwoOutputs())
    results["tuple_output_with_grad"] = caught(lambda: two(md.tensor(np.ones((1, 3)))))
    # still usable after each error: a plain step works and leaves nothing gathered
    fsdp(ids).sum().backward()
    results["usable_after_errors"] = [u.gathered for u in fsdp.units]

    # Usage patterns that must work (recorded as None when they do):
    def evaluation_between_forward_and_backward():  # the root must stay as the graph saw it
        loss = fsdp(ids).sum()
        with md.no_grad():
            fsdp(ids)
        loss.backward()

    def two_forwards_one_backward():
        (fsdp(ids).sum() + fsdp(ids[:1]).sum()).backward()

    def forward_without_backward_then_step():  # the next forward must see the stepped root, not the old
        optimizer = optim.SGD(fsdp.parameters(), lr=0.5)
        fsdp(ids).sum().backward()
        fsdp(ids)  # gradients on, no backward: the root stays gathered
        optimizer.step()
        loss = fsdp(ids).sum()
        installed = fsdp.units[0].params[0].data.copy()  # wte.weight as the forward used it
        loss.backward()
        if not np.array_equal(installed, fsdp.state_dict()["wte.weight"]):
            raise AssertionError("the forward after the step used the root's old values")

    def zero_grad_drops_no_sync_gradients():
        with fsdp.no_sync():
            fsdp(ids).sum().backward()
        kept = [p.grad is not None for u in fsdp.units for p in u.params]
        fsdp.zero_grad()
        left = [p.grad is not None for u in fsdp.units for p in u.shards + u.params]
        if not all(kept) or any(left):
            raise AssertionError(f"no_sync kept {kept}; after zero_grad {left}")

    def failed_backward_leaks_nothing():  # its blocks' reduce-scatters ran; their sums must not stay
        def clean_gradients():
            fsdp.zero_grad()
            fsdp(ids).sum().backward()
            return [s.grad.copy() for u in fsdp.units for s in u.shards if s.grad is not None]

        expected = clean_gradients()
        wte = fsdp.units[0].params[0]
        raise_once = [True]

        def hook(p):  # wte's gradient is complete last, after every block's backward has run
            if raise_once.pop() if raise_once else False:
                raise RuntimeError("a hook failed")

        wte.register_post_accumulate_grad_hook(hook)
        fsdp.zero_grad()
        if caught(lambda: fsdp(ids).sum().backward()) is None:
            raise AssertionError("the hook did not raise")
        got = clean_gradients()
        if len(got) != len(expected) or not all(np.array_equal(a, b) for a, b in zip(got, expected)):
            raise AssertionError("gradients of the failed backward leaked into the next one")

    for case in (evaluation_between_forward_and_backward, two_forwards_one_backward,
                 forward_without_backward_then_step, zero_grad_drops_no_sync_gradients,
                 failed_backward_leaks_nothing):  # fmt: skip
        results[case.__name__] = caught(case)
    results["nothing_gathered_at_the_end"] = not any(u.gathered for u in fsdp.units)
    write_json(out_dir, f"rank{world.rank}.json", results)


if __name__ == "__main__":
    run_worker(main, *sys.argv[1:])
