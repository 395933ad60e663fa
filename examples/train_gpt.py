"""Train a character-level GPT on Shakespeare, data-parallel: ``mpirun -n 8 python examples/train_gpt.py``.

Read it top to bottom: arguments -> data -> model -> optimizer -> resume -> training loop (evaluation,
logging, checkpoints) -> the final validation loss and a generated sample. Every rank runs this same
file (SPMD). Each optimizer step uses ``--batch-size`` windows of ``--block-size`` characters in all, cut
into ``--grad-accum`` micro-batches and split across the ranks; DistributedDataParallel averages the
gradients (or, with ``--zero 1|2``, the ZeRO optimizer reduce-scatters them and keeps 1/N of the AdamW
state per rank). Any number of ranks trains the same model as one process, from the same seed (up to
float rounding; with --dropout each rank draws its own masks, so there the layout changes the result).

The ranks can also form a 4-D mesh, dp x tp x pp x cp = ranks (Megatron-LM's layouts): --tp splits the
heads, the MLP and the vocabulary (with --sequence-parallel the LayerNorms work on T / tp positions),
--pp cuts the layers into pipeline stages (--schedule, --microbatches), --cp splits the sequence (ring
attention); the rest is --dp. The model, data and steps stay the same, so every layout trains the model
of one process; checkpoints load on any other layout. That machinery is in train_gpt_layout.py; the
flags and their checks are in train_gpt_args.py.

    mpirun -n 8 python examples/train_gpt.py                          # defaults: val loss 1.85, ~6 min
    python examples/train_gpt.py --max-iters 50 --eval-interval 25    # a quick look on one process
    mpirun -n 4 python examples/train_gpt.py --zero 2 --grad-accum 2  # same model, sharded AdamW state
    mpirun -n 4 python examples/train_gpt.py --fsdp                  # parameters sharded too (ZeRO-3)
    mpirun -n 4 python examples/train_gpt.py --fsdp --tp 2           # FSDP over dp 2 x tensor parallel 2
    mpirun -n 8 python examples/train_gpt.py --data my_text.txt       # any UTF-8 text file
    mpirun -n 8 python examples/train_gpt.py --checkpoint-dir ckpt --max-iters 200   # then --resume
    mpirun -n 8 python examples/train_gpt.py --dp 2 --tp 2 --pp 2     # tensor x pipeline x data
    mpirun -n 8 python examples/train_gpt.py --dp 2 --tp 2 --cp 2 --sequence-parallel   # x context
    mpirun -n 8 python examples/train_gpt.py --dtype bfloat16         # docs/mixed-precision.md

What the flags cost and buy, measured with ``mpirun -n 8`` on a 2-core laptop (tokens/s over steps
41-60 of a run; figures and conditions in docs/performance.md, "What the example's flags cost on 8
ranks"):
  defaults        batch 32 x block 64, 4 layers x 4 heads x width 128 (0.81 M parameters), 1000 steps:
                  val loss 1.8543 in 5 min 40 s (6,400-7,200 tokens/s; the same 1.8543 on one process)
  --batch-size    16: 5,000-5,500 tokens/s; a 2000-step run reaches val 1.96 at step 1000, 1.81 at 2000.
                  64: 8,000-8,600 tokens/s (the ranks' fixed cost per step is shared by more windows)
  --n-layer 6     4,700 tokens/s (-33 %): more capacity, slower steps; likewise --n-embd, --block-size: the
                  matmul work per token is 6 x parameters + 12 x layers x block x width (flops_per_token)
  --max-iters     linear in time; the validation loss keeps falling to ~2000 steps here (train falls
                  faster: the validation text is a play the model never reads)
  --dropout 0.1   6,000 tokens/s (-14 %); regularises long runs, slows short ones; rank-dependent masks
  --grad-accum 2  5,400-6,300 tokens/s (-10-20 %): the same result with half the activation memory
  --zero 1|2      6,800-7,900 tokens/s (no measurable cost here): the same result with the AdamW state
                  (and with 2 the gradients) split over the ranks
  --fsdp          parameters, gradients and AdamW state all split over the ranks, each Block gathered only
                  while it computes (and recomputed in backward): 30 steps on 4 ranks took 94 s against
                  DDP's 75 s (load 20 on 2 cores), with the same val loss (2.7375) and sample
  --dp 2 --tp 2 --pp 2 / --dp 2 --tp 2 --cp 2 --sequence-parallel: after 100 steps the val loss of --dp 8
                  to float32 rounding (2.5104783), at 0.5-0.7x its tokens/s on this one 2-core machine
                  (docs/performance.md, "What the example's flags cost on 8 ranks"): they are for models
                  that do not fit one device
"""

# ruff: noqa: E402  (NumPy, imported below, must start after OMP_NUM_THREADS is set)
import os

# One BLAS thread per rank, set before NumPy loads its BLAS: 8 ranks on a 2-core laptop would
# otherwise each start a thread per core, and the threads would fight over the cores.
for threads in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(threads, "1")

import contextlib
import functools
import io
import sys
import time

import numpy as np

# Tests load this file by its path; `python examples/train_gpt.py` puts the folder on the path itself.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from train_gpt_args import parse_arguments, parser  # noqa: F401  (the flags: train_gpt_args.py; tests use parser)
from train_gpt_layout import MeshTraining, check_layout, is_data_parallel

import minidist as md
import minidist.distributed as dist
from minidist import backend, checkpoint, memory, optim
from minidist.amp import GradScaler
from minidist.data import CharTokenizer, RandomWindows, load_shakespeare, load_text, train_val_split
from minidist.models import GPT, GPTConfig
from minidist.models.gpt.transformer import Block
from minidist.nn import functional as F
from minidist.optim.lr_scheduler import cosine_with_warmup
from minidist.parallel import (
    DistributedDataParallel,
    FullyShardedDataParallel,
    ZeroRedundancyOptimizer,
    clip_grad_norm_,
)
from minidist.parallel.comm_hooks import register_by_name
from minidist_tools.checkpoint_info import seed_mismatch
from minidist_tools.fault import FaultPlan
from minidist_tools.header import header_lines, modes, plural
from minidist_tools.metrics import MetricsLog, max_rss_mib
from minidist_tools.progress import progress
from minidist_tools.report import exit_interrupted, exit_with_error


def estimate_loss(gpt: GPT, splits: dict, eval_iters: int, autocast: md.autocast) -> dict[str, float]:
    """Mean loss on ``eval_iters`` global batches of each split's windows (the same windows at every
    evaluation: they come from the windows' own evaluation stream), each rank scoring its slice."""
    gpt.eval()  # no dropout
    losses = {}
    with md.no_grad():  # no graph: forward only
        for split, windows in splits.items():
            total = np.zeros(2)  # [sum of micro-batch mean losses, micro-batches]
            for x, y in windows.eval_batches(eval_iters):
                with autocast:  # (off unless --dtype bfloat16|float16; the loss in float32 then too)
                    logits = gpt(x)
                    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
                total += (loss.item(), 1)
            dist.all_reduce(total, op="sum")  # equal micro-batches everywhere: the mean of means is the mean
            losses[split] = float(total[0] / total[1])
    gpt.train()
    return losses


def matmul_rate(world: dist.Communicator) -> float:
    """FLOP/s of a float32 (512 x 512) product, summed over the ranks, all timing at once: what this
    machine delivers to the job when every rank computes. The denominator of the MFU (model FLOPs
    utilisation, PaLM, Chowdhery et al. 2022, appendix B)."""
    a = np.ones((512, 512), dtype=np.float32)
    world.barrier()
    seconds = []
    for _ in range(5):
        start = time.perf_counter()
        a @ a
        seconds.append(time.perf_counter() - start)
    rate = np.array([2 * 512**3 / np.median(seconds)])
    dist.all_reduce(rate, op="sum")
    return float(rate[0])


def main() -> None:
    # --- setup: start MPI; parse the same command line on every rank (only rank 0 prints argparse's
    # messages; a bad flag still exits every rank, with argparse's code 2).
    sys.stdout.reconfigure(line_buffering=True)  # under mpirun stdout is a pipe: show each line as it comes
    world = dist.init()
    rank, world_size = world.rank, world.size
    with contextlib.redirect_stdout(io.StringIO()) if rank else contextlib.nullcontext():
        with contextlib.redirect_stderr(io.StringIO()) if rank else contextlib.nullcontext():
            args = parse_arguments()
    check_layout(args, world_size)  # fills in --dp; a layout that does not fit: ValueError on every rank
    faults = FaultPlan(
        rank
    )  # MINIDIST_FAULT=kill:rank=R:step=S (fault.py); a bad value fails before any work
    # tp, pp or cp > 1 (or sequence parallelism): a ProcessMesh and the parallel GPT, train_gpt_layout.py
    mesh_run = None if is_data_parallel(args) else MeshTraining(args)
    mesh = mesh_run.mesh if mesh_run else None  # (None: data parallelism over the world, for checkpoints)

    # --- data: characters -> integer ids. Every rank reads the whole text (about 1 MB).
    text = load_text(args.data) if args.data else load_shakespeare()
    tokenizer = CharTokenizer(text)  # the vocabulary: every distinct character, sorted
    train_ids, val_ids = train_val_split(tokenizer.encode(text))  # first 90 % train, last 10 % validation
    for part, ids in (("training part (first 90 %)", train_ids), ("validation part (last 10 %)", val_ids)):
        if len(ids) < args.block_size + 1:  # (RandomWindows would say so too, without naming the part)
            raise ValueError(
                f"the text's {part} has {len(ids)} characters, fewer than --block-size + 1 = "
                f"{args.block_size + 1} (a window and the character after it); use a longer text or a "
                "smaller --block-size."
            )
    # Each step draws --batch-size random windows, the same on every rank (from the seed and the step
    # number); this rank takes its slice, as --grad-accum micro-batches. --batch-size must divide by
    # ranks x --grad-accum (a ValueError on every rank otherwise, saying which sizes work).
    batches, val_batches = (
        RandomWindows(ids, args.block_size, args.batch_size, seed=args.seed, rank=rank,
                      world_size=world_size, accumulation_steps=args.grad_accum)
        if mesh_run is None else mesh_run.windows(ids)  # on a mesh: one share per dp rank
        for ids in (train_ids, val_ids)
    )  # fmt: skip

    # --- model: the same seed gives every rank the same initial weights (DDP/ZeRO broadcast rank 0's).
    md.manual_seed(args.seed)
    config = GPTConfig(
        vocab_size=tokenizer.vocab_size, block_size=args.block_size, n_layer=args.n_layer,
        n_head=args.n_head, n_embd=args.n_embd, dropout=args.dropout, bias=args.bias, dtype=args.param_dtype,
    )  # fmt: skip
    gpt = GPT(config)
    n_params = gpt.num_parameters()  # (counted now: FSDP below moves the weights into its shards)
    if mesh_run:  # every rank keeps its pieces of this model (tp shards, pp stage); gpt itself is not trained
        mesh_run.build(gpt)
    # --- optimizer: AdamW, weight decay on the matrices only (biases and LayerNorm gains are not decayed:
    # pulling them toward 0 regularises nothing and fights the normalisation).
    params = mesh_run.params if mesh_run else list(gpt.parameters())  # on a mesh: this rank's pieces
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    betas = (0.9, args.beta2)
    if mesh_run:  # DDP over dp x cp, FSDP over dp (--tp), or the pipeline (it combines the gradients itself)
        model = mesh_run.wrapped
        optimizer = optim.AdamW(mesh_run.optimizer_groups(groups), lr=args.lr, betas=betas)  # (FSDP: shards')
    elif args.fsdp:
        # FSDP (ZeRO-3): each Block is a unit, gathered only while it computes (recomputed in backward); the
        # rest (embeddings, tied head, final LayerNorm) is the root unit. AdamW steps this rank's shards.
        model = FullyShardedDataParallel(gpt, wrap=(Block,))
        optimizer = optim.AdamW(model.shard_param_groups(groups), lr=args.lr, betas=betas)
    elif args.zero:
        # ZeRO (Rajbhandari et al. 2020): no DDP wrapper; step() reduce-scatters the gradients, updates this
        # rank's shard of the parameters with its shard of the AdamW state, and all-gathers the parameters.
        model = gpt
        optimizer = ZeroRedundancyOptimizer(groups, optim.AdamW, stage=args.zero, lr=args.lr, betas=betas)
    else:
        model = DistributedDataParallel(gpt)  # averages the gradients over the ranks during backward
        optimizer = optim.AdamW(groups, lr=args.lr, betas=betas)
    if isinstance(model, DistributedDataParallel):  # --comm-hook: compress what DDP sends (PowerSGD's
        register_by_name(model, args.comm_hook, powersgd_rank=args.powersgd_rank)  # state is not saved)
    # The header names every mode that is on (FSDP and its units, ZeRO, hooks, precision, layout, debug
    # mode...: minidist_tools/header.py); --metrics FILE records it, then the measurements, as JSON lines.
    fsdp = model if isinstance(model, FullyShardedDataParallel) else None
    active = modes(args, world_size, fsdp_units=len(fsdp.units) if fsdp else None)
    layout = {"dp": args.dp, "tp": args.tp, "pp": args.pp, "cp": args.cp}
    metrics = MetricsLog(args.metrics if rank == 0 else None)
    if rank == 0:
        first = (
            f"GPT: {n_params:,} parameters, {plural(tokenizer.vocab_size, 'character')}, "
            f"{plural(world_size, 'rank')} ({mesh_run.describe() if mesh_run else f'dp {args.dp}'})"
        )
        print("\n".join(header_lines(first, active)))
        metrics.header("train_gpt.py", args, world_size, layout, active)
    # Linear warmup (large early updates of a random transformer diverge easily), then a cosine decay.
    # A run shorter than the warmup (a quick look) warms up over its first half instead.
    # Mixed precision (--dtype bfloat16|float16): the forward under autocast; float16 also scales the loss
    # (its gradients underflow below 6e-8), skipping the steps whose gradients overflow. Under ZeRO each rank
    # sees only its own gradients before the reduce-scatter: the skip is agreed over the world. bfloat16
    # needs no scaling (float32's range): a disabled scaler passes every call through. DDP averages the
    # float32 master gradients in float32 (no --comm-hook by default: bf16 loses ~3 digits of the average).
    autocast = md.autocast(dtype=args.autocast or "bfloat16", enabled=args.autocast is not None)
    scaler = GradScaler(enabled=args.autocast == "float16", group=world if args.zero or args.fsdp else None)
    warmup = max(1, min(args.warmup_iters, args.max_iters // 2))
    scheduler = cosine_with_warmup(optimizer, warmup, max(args.max_iters, 2), eta_min=args.min_lr)

    # Dropout masks from here on: each rank its own stream (seed + rank), as nanoGPT does. With one seed
    # for all, every rank would drop the same units of its (different) windows: the masks of the global
    # batch would repeat once per rank instead of being drawn independently for each window. (Per
    # data-parallel rank: the ranks of a tensor-parallel group, which hold the same activations, need one
    # stream; on a mesh, seed_dropout does that.)
    if mesh_run is None:
        md.manual_seed(args.seed + rank)
    else:
        mesh_run.seed_dropout(args.seed)

    # --- resume: weights, AdamW state, the position in the data stream, the schedule, the dropout streams.
    step, losses = 0, []
    if args.resume:
        # Checkpoints of another --seed: one message naming the flag (load_latest would report each one as
        # a checkpoint that does not load, as if the files were damaged), on every rank alike.
        mismatch = world.mpi.bcast(
            seed_mismatch(args.checkpoint_dir, args.seed) if rank == 0 else None, root=0
        )
        if mismatch:
            raise ValueError(mismatch)
        info = checkpoint.load_latest(
            args.checkpoint_dir, model, optimizer, mesh=mesh, sampler=batches, fallback=True, missing_ok=True
        )  # (saved on another layout: resharded, by GPT's parameter names; a damaged one is skipped)
        if info is not None:
            step, losses = info["step"], list(info["extra"]["losses"])
            if scaler.is_enabled() and info["extra"].get("scaler"):  # the loss scale and skipped steps
                scaler.load_state_dict(info["extra"]["scaler"])
            # The rate is a function of the step and of THIS run's flags: step the schedule to where the run
            # stands. (Loading the saved scheduler would keep the saved run's --max-iters: a run extended
            # with a larger one would follow the cosine past its end, back up to the peak rate.)
            for _ in range(step):
                scheduler.step()
            saved = CharTokenizer.from_state_dict(info["extra"]["tokenizer"]).chars
            if saved != tokenizer.chars:  # as many characters (the weights fit), but an id means another
                lost = "".join(sorted(set(saved) - set(tokenizer.chars)))
                new = "".join(sorted(set(tokenizer.chars) - set(saved)))
                raise ValueError(
                    f"the checkpoint was trained on another vocabulary (this text lacks {lost!r} and has "
                    f"{new!r} instead); resume with the --data it was trained on."
                )
            if rank == 0:  # (a checkpoint of another layout was resharded to this one: say from which)
                saved = " x ".join(
                    f"{dim}={info['saved_mesh'].get(dim, 1)}" for dim in ("dp", "tp", "pp", "cp")
                )
                how = f" (saved on {saved}, resharded)" if info["resharded"] else ""
                print(f"resumed from {info['path']}{how} at step {step}")
        elif rank == 0:
            print(f"no checkpoint in {args.checkpoint_dir}: starting from scratch")

    def evaluate(train: RandomWindows, val: RandomWindows) -> dict[str, float]:
        """Train and validation loss estimates (the same windows on every layout)."""
        evaluate_on = (
            mesh_run.estimate_loss if mesh_run else functools.partial(estimate_loss, model, autocast=autocast)
        )
        return evaluate_on({"train": train, "val": val}, args.eval_iters)

    # --- memory accounting (--memory, --memory-budget SIZE or MINIDIST_MEMORY_BUDGET): bytes per category,
    # measured; going over the budget raises memory.OutOfMemoryError, naming what holds the memory.
    tracker = None
    if args.memory or args.memory_budget or os.environ.get(memory.BUDGET_ENV):
        tracker = memory.MemoryTracker(model, optimizer, budget=args.memory_budget, rank=rank).start()

    # --- training loop
    peak = matmul_rate(world)  # FLOP/s, for the MFU
    flops_per_step = gpt.flops_per_token() * args.batch_size * args.block_size
    # A live bar on a terminal; in a log file or a pipe, a plain line every tenth of the run (no \r frames)
    bar = progress(total=args.max_iters, initial=step, enabled=rank == 0, desc="train")
    evaluated_at, estimate = None, None
    logged_at, seconds = step, 0.0  # the step of the last log line, and the training seconds since then
    while step < args.max_iters:
        start, step_loss = time.perf_counter(), np.zeros(1)
        if mesh_run:  # the same step on a mesh, its gradients combined over the mesh's groups; the loss is
            # this replica's mean, equal on its tp and pp ranks: the mean over all ranks below is still the
            # mean over the global batch
            step_loss[0] = mesh_run.forward_backward(batches)
        else:
            for k in range(args.grad_accum):
                x, y = batches.next()  # this rank's (batch / ranks / grad_accum, block) ids and next chars
                with autocast:  # (off unless --dtype bfloat16|float16)
                    logits = model(x)  # (b, T, vocab)
                    # The mean over this rank's windows, / grad_accum: DDP's average over equal shares of
                    # every micro-batch then gives the gradient of the mean loss over the global batch.
                    loss = (
                        F.cross_entropy(logits.reshape(-1, config.vocab_size), y.reshape(-1))
                        / args.grad_accum
                    )
                last = k == args.grad_accum - 1
                # All but the last backward accumulate locally (no_sync); the last all-reduces the sum once.
                with contextlib.nullcontext() if last or args.zero else model.no_sync():  # (DDP's or FSDP's)
                    scaler.scale(loss).backward()  # (loss itself unless --dtype float16)
                step_loss += loss.item()
        scaler.unscale_(optimizer)  # float16: the true gradients for clipping (and inf/NaN found, agreed)
        if args.grad_clip:
            # By the norm of the averaged gradient, as one process would (Pascanu et al. 2013). Under ZeRO
            # the averaged gradient exists only as shards after the reduce-scatter: it clips those.
            if mesh_run:  # summed over the tp shards and the pp stages (train_gpt_layout.py)
                mesh_run.clip_grad_norm_(args.grad_clip)
            elif args.zero:
                optimizer.clip_grad_norm_(args.grad_clip)
            elif args.fsdp:  # the same: the averaged gradient is in the shards
                model.clip_grad_norm_(args.grad_clip)
            else:
                clip_grad_norm_(gpt.parameters(), args.grad_clip)
        scaler.step(optimizer)  # optimizer.step(), unless float16 gradients overflowed: then skipped
        scaler.update()
        optimizer.zero_grad()
        scheduler.step()
        dist.all_reduce(step_loss, op="sum")  # the mean loss over the global batch (a one-number all-reduce)
        losses.append(float(step_loss[0]) / world_size)
        step += 1
        seconds += time.perf_counter() - start
        bar.update()
        if step % args.log_interval == 0 or step == args.max_iters:
            steps = step - logged_at
            tokens_per_s = steps * args.batch_size * args.block_size / seconds
            mfu = steps * flops_per_step / seconds / peak  # achieved FLOP/s over the measured matmul rate
            loss_now = np.mean(losses[-steps:])  # the mean over the steps since the last line
            if rank == 0:  # (tqdm.write prints on every rank, also where the bar is disabled)
                bar.write(f"step {step:5d}: loss {loss_now:.4f}, {tokens_per_s:,.0f} tokens/s, MFU {mfu:.1%}")
                lr = optimizer.param_groups[0]["lr"]
                metrics.step(
                    step, loss=loss_now, lr=lr, tokens_per_s=tokens_per_s, mfu=mfu, max_rss_mib=max_rss_mib()
                )
            logged_at, seconds = step, 0.0
        if step % args.eval_interval == 0 or step == args.max_iters:
            estimate = evaluate(batches, val_batches)
            evaluated_at = step
            if rank == 0:
                bar.write(
                    f"step {step:5d}: train loss {estimate['train']:.4f}, val loss {estimate['val']:.4f}"
                )
                metrics.step(step, train_loss=estimate["train"], val_loss=estimate["val"])
            if args.checkpoint_dir:  # collective and atomic; keeps the newest 2
                checkpoint.save(
                    args.checkpoint_dir, model, optimizer, step=step, mesh=mesh, sampler=batches, keep_last=2,
                    extra={"scheduler": scheduler.state_dict(), "tokenizer": tokenizer.state_dict(),
                           "losses": losses, "scaler": scaler.state_dict()}, async_save=args.async_checkpoint,
                )  # fmt: skip
            logged_at, seconds = step, 0.0  # evaluating and saving are not training time
        faults.at_step(step)  # MINIDIST_FAULT=kill:rank=R:step=S kills rank R here (a teaching aid)
    bar.close()
    checkpoint.wait_pending()  # --async-checkpoint: the last save is committed (or its error raised) now

    # --- the result: the validation loss and a sample from the model.
    if evaluated_at != step:  # resumed a finished run: nothing was trained or evaluated
        estimate = evaluate(batches, val_batches)
    if mesh_run:  # the pieces put back together into one GPT on rank 0 (collective), for the sample
        gpt = mesh_run.gathered()
    if rank == 0 and args.report_bytes and isinstance(model, DistributedDataParallel):
        sent = model.comm_stats.per_step()
        print(f"--comm-hook {args.comm_hook}: {sent['bytes_sent'] / 1024:.1f} KiB sent per step by rank 0, "
              f"{sent['compression_ratio']:.1f}x less payload than a plain all-reduce")  # fmt: skip
    if tracker is not None:  # every rank's table, printed by rank 0
        tracker.stop()
        tables = world.mpi.gather(tracker.table(), root=0)
        if rank == 0:
            print("\n".join(tables))
    if rank == 0 and scaler.is_enabled():
        skipped, scale = scaler.skipped_steps, scaler.get_scale()
        print(f"skipped steps: {skipped} (inf/NaN gradients), final loss scale {scale:g}")
    # Under --fsdp the GPT holds its full weights only inside summon_full_params (collective on entry); on a
    # mesh, gpt is the one-process GPT that mesh_run.gathered() put together above.
    with model.summon_full_params() if args.fsdp and not mesh_run else contextlib.nullcontext():
        if rank == 0:
            report_and_sample(args, gpt, estimate, tokenizer, text, losses, scaler)


def report_and_sample(
    args, gpt: GPT, estimate: dict, tokenizer: CharTokenizer, text: str, losses: list, scaler: GradScaler
):
    """Rank 0: print the validation loss and a sample; with --out, save the losses and weights."""
    print(f"val loss: {estimate['val']:.4f}")
    # (1, 1): start from a newline, or from the text's first character if it has none
    prompt = tokenizer.encode("\n" if "\n" in tokenizer.chars else text[0])[None, :]
    rng = np.random.default_rng(args.seed)  # its own generator: sampling leaves training's untouched
    sample = gpt.generate(prompt, args.sample_tokens, temperature=0.8, top_k=20, generator=rng)
    print(tokenizer.decode(sample[0]))
    if args.out:  # for tests: the weights and losses of N ranks should equal those of 1
        weights = {name: p.numpy() for name, p in gpt.named_parameters()}
        scalars = {"val_loss": estimate["val"], "train_loss": estimate["train"]}
        scalars["skipped_steps"] = scaler.skipped_steps
        np.savez(args.out, losses=np.array(losses), **scalars, **weights)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # Ctrl-C reaches every rank: one line for the job, not a traceback per rank
        exit_interrupted()
    except (ValueError, OSError, backend.DeviceUnavailableError, checkpoint.CheckpointError,
            memory.OutOfMemoryError) as error:  # fmt: skip
        # Bad input, a missing data file, no checkpoint that loads: one message (not a traceback per rank)
        # and exit code 2 on every rank.
        exit_with_error(error, code=2)
