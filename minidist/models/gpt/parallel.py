"""``ParallelGPT``: the GPT split over a process mesh: tensor (+ sequence) and context parallelism.

The model is the one-process ``GPT`` cut into pieces: every rank builds the full ``GPT(config)`` from
the same seed and keeps its part (Megatron-LM's CPU initialisation), so any layout starts from the
identical model and its parameters have GPT's names (``wte.weight``, ``h.3.attn.c_attn.weight``), which
checkpoints use to reshard. On a mesh with tp ranks, cp ranks (and dp, pp):

* ``wte`` (V, C) is split over the vocabulary (``VocabParallelEmbedding``, Shoeybi et al. 2019, §3):
  rank r holds rows ``shard_bounds(V, tp, r)`` (65 over 2: 33 + 32). The tied output head multiplies
  by the same rows, so the **logits are vocabulary-sharded** (B, T, V_r) and the loss is
  ``vocab_parallel_cross_entropy``: the (B, T, V) logits are never gathered.
* every block is a ``ParallelBlock`` (heads split, MLP column then row); ``wpe``, ``ln_f`` replicated.
* ``sequence_parallel`` (Korthikanti et al. 2022, §4.2.2): the residual stream is (B, T / tp, C), this
  tp rank's positions: the embedding's all-reduce becomes a reduce-scatter, and ``ln_f``'s output is
  all-gathered before the head. ``wpe`` and every LayerNorm then carry ``sequence_parallel = True``.
* context parallelism (cp > 1, ring attention, Liu et al. 2023): ``forward`` takes this rank's tokens
  (B, T / cp) of the balanced split (``context_parallel.split_for_context_parallel``), reads their
  global positions from ``context_parallel_positions`` and attends with ``ring_attention`` over
  ``mesh.cp_group``. Attention dropout is not implemented under cp (``NotImplementedError``).

**One training step** (the order of the gradient combination, as Megatron's finalize-grads step)::

    ddp = DistributedDataParallel(model, group=mesh.dp_cp_group)  # cp ranks are data-parallel for weights
    loss = model.loss(ddp(idx_local), targets_local)   # idx_local: this rank's rows and tokens
    loss.backward()                                    # DDP averages over dp x cp
    model.allreduce_sequence_parallel_grads()          # sums the sequence-parallel grads over tp
    clip_grad_norm_(model.parameters(), ...); optimizer.step()

The last two sums commute (both are linear), so it does not matter that DDP ran first.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict
from typing import Any

from minidist import backend, random
from minidist.autograd import Tensor
from minidist.distributed import agree
from minidist.distributed.safety.agreement import all_gather_json
from minidist.models.gpt.model import GPT, GPTConfig
from minidist.models.gpt.parallel_layers import ParallelGPTEmbedding, ParallelGPTHead, SequenceLayout
from minidist.models.gpt.pipeline import WeightHolder
from minidist.nn.layers import Sequential
from minidist.nn.module import Module
from minidist.parallel.tensor_parallel import (
    ParallelBlock,
    VocabParallelEmbedding,
    allreduce_sequence_parallel_grads,
    reduce_scatter_to_sequence_parallel_region,
    vocab_parallel_cross_entropy,
)
from minidist.parallel.tensor_parallel.cut import cut_parameter, replicate


class ParallelGPT(Module):
    """A GPT split over ``mesh`` (module docstring); ``forward(idx_local)`` -> vocabulary-sharded logits.

    ``ParallelGPT(config, mesh)`` builds the full ``GPT(config)`` on every rank and cuts it; the ranks
    first agree on ``config`` and adopt the world's rank 0 generator state (so a per-rank seed still
    builds one model; replicated dropout masks then also agree across dp ranks, as in Megatron).
    ``ParallelGPT.from_gpt(gpt, mesh)`` cuts an existing GPT (the same on every rank). Collective over
    ``mesh.world``.

    Shapes: ``forward(idx_local)``: token ids (B, T / cp) (this rank's tokens of the cp split, the same on
    every tp rank) -> logits (B, T / cp, V_r), V_r = this tp rank's vocabulary rows
    (``self.wte.vocab_start``, ``vocab_end``). ``loss(logits, targets_local)``: the mean cross-entropy
    over this rank's tokens (a scalar, the same on every tp rank).

    Raises (at construction, on every rank): ``ValueError`` if ``n_head`` is not divisible by tp,
    V < tp, ranks passed different configs; ``NotImplementedError`` for dropout > 0 with cp > 1.
    In ``forward``: ``ValueError`` for ids that are not (B, T_local), a sequence longer than
    ``block_size``, T_local not divisible by tp under sequence parallelism or T not divisible by 2 cp;
    ``IndexError`` on every tp rank for an id outside [0, V).
    """

    def __init__(self, config: GPTConfig, mesh: Any, sequence_parallel: bool = False) -> None:
        super().__init__()
        error = (
            None if isinstance(config, GPTConfig) else TypeError("ParallelGPT: config must be a GPTConfig")
        )
        values = {k: str(v) for k, v in asdict(config).items()} if error is None else {}
        agree(
            values, error, mesh.world, what="ParallelGPT", fix="build it with the same GPTConfig everywhere"
        )
        _share_generator(mesh.world)
        self._cut(GPT(config), mesh, sequence_parallel)

    @classmethod
    def from_gpt(cls, gpt: GPT, mesh: Any, sequence_parallel: bool = False) -> ParallelGPT:
        """This rank's part of ``gpt`` (the same full model on every rank); ``gpt`` is not changed.

        Collective over ``mesh.world``: the ranks first compare a hash of their GPT's names and weights
        (one pass over the model, one small all-gather), so a GPT built from a per-rank seed raises
        ``ValueError`` on every rank instead of cutting pieces of different models.
        """
        digest = hashlib.sha256()
        for name, p in gpt.named_parameters():
            digest.update(name.encode())
            digest.update(backend.to_numpy(p.data).tobytes())
        agree(
            {"weights (sha256)": digest.hexdigest()[:16]},
            None,
            mesh.world,
            what="ParallelGPT.from_gpt",
            fix="build the GPT from the same seed on every rank (md.manual_seed(s) before GPT(config)), "
            "or build ParallelGPT(config, mesh), which makes the ranks' generators agree first",
        )
        model = cls.__new__(cls)
        Module.__init__(model)
        model._cut(gpt, mesh, sequence_parallel)
        return model

    def _cut(self, gpt: GPT, mesh: Any, sequence_parallel: bool) -> None:
        c, tp = gpt.config, mesh.tp_group
        cp, cp_rank = getattr(mesh, "cp", 1), getattr(mesh, "cp_rank", 0)
        if cp > 1 and c.dropout > 0:  # the config is the same everywhere: every rank raises
            raise NotImplementedError(
                f"ParallelGPT: dropout={c.dropout} with cp={cp}: attention dropout is not implemented "
                "under context parallelism (ring attention); use dropout=0 or cp=1"
            )
        self.config, self.mesh, self.sequence_parallel = c, mesh, bool(sequence_parallel)
        self.layout = SequenceLayout(tp, self.sequence_parallel, cp, cp_rank, c.block_size)
        self.wte = VocabParallelEmbedding.from_weight(gpt.wte.weight, tp)
        if sequence_parallel:  # the embedding's sum leaves each rank its positions only
            self.wte.reduce = reduce_scatter_to_sequence_parallel_region
        # wpe and ln_f are used on this rank's positions only under sequence parallelism: flagged
        self.wpe, self.drop = replicate(gpt.wpe, tp, sequence_parallel), replicate(gpt.drop, tp)
        self.h = Sequential(*[ParallelBlock(block, tp, sequence_parallel) for block in gpt.h])
        self.ln_f = replicate(gpt.ln_f, tp, sequence_parallel)
        if cp > 1:
            for block in self.h:
                block.attn.context_parallel_group = mesh.cp_group
        if gpt.lm_head is None:
            self.lm_head = None
        else:  # untied: the head's (V, C) weight split over the vocabulary like wte's
            self.lm_head = WeightHolder(cut_parameter(gpt.lm_head.weight, 0, tp))
        # The two ends as layers (the same ones pipeline_layers() gives), holding this model's modules:
        # set past Module.__setattr__, so they are not children (the parameters keep GPT's names).
        object.__setattr__(
            self, "_embedding", ParallelGPTEmbedding(self.wte, self.wpe, self.drop, self.layout)
        )
        object.__setattr__(self, "_head", ParallelGPTHead(self.ln_f, self.wte, self.lm_head, self.layout))

    def forward(self, idx: Any) -> Tensor:
        """Vocabulary-sharded logits (B, T_local, V_r) for this rank's token ids ``idx`` (B, T_local)."""
        return self._head(self.h(self._embedding(idx)))

    def loss(self, logits: Tensor, targets: Any) -> Tensor:
        """Mean cross-entropy of the sharded ``logits`` (B, T_local, V_r) against global ids (B, T_local)."""
        return vocab_parallel_cross_entropy(logits, targets, self.mesh.tp_group, reduction="mean")

    def allreduce_sequence_parallel_grads(self) -> int:
        """Sum over tp the gradients of the parameters flagged ``sequence_parallel`` (call after backward,
        before clipping and the optimizer step); returns how many. Nothing to do without sequence
        parallelism (returns 0 without communicating)."""
        if not self.sequence_parallel:
            return 0
        return allreduce_sequence_parallel_grads(self.parameters(), self.mesh.tp_group)

    def pipeline_layers(self) -> Sequential:
        """This model as ``n_layer + 2`` layers for pipeline parallelism, sharing its modules:
        ``[embedding (wte, wpe, drop), h.0 .. h.<L-1>, head (ln_f, output projection)]``. Each layer's
        ``pipeline_name`` ("" for the ends, "h.<i>" for block i) keeps GPT's parameter names."""
        for i, block in enumerate(self.h):
            block.pipeline_name = f"h.{i}"
        embedding = ParallelGPTEmbedding(self.wte, self.wpe, self.drop, self.layout)
        return Sequential(embedding, *self.h, ParallelGPTHead(self.ln_f, self.wte, self.lm_head, self.layout))

    def extra_repr(self) -> str:
        mesh = self.mesh
        return f"tp={mesh.tp_group.size}, cp={self.layout.cp}, sequence_parallel={self.sequence_parallel}"


def _share_generator(world: Any) -> None:
    """Adopt the world's rank 0 generator state (one small all-gather), so the full GPT is one model."""
    if world.size > 1:
        random.set_rng_state(all_gather_json(random.get_rng_state(), world)[0])
