"""Capture once, replay fast: a training step recorded as a fixed program of array kernels.

An eager step pays, for every op, for what makes eager friendly: a ``Tensor`` per result, version
counters, argument checks, the graph and its walk (docs/performance.md, "Per-step overhead of
autograd"). A compiler records the step once and runs the recording afterwards: ``torch.compile``
captures Python bytecode into a graph guarded by the inputs' shapes (Ansel et al. 2024, "PyTorch 2:
Faster Machine Learning Through Dynamic Python Bytecode Transformation and Graph Compilation"), CUDA
graphs record the kernels one stream launched and relaunch them with one call, and tinygrad's
``TinyJit`` records the kernels of a function's second call and replays them on later calls.

Design (decided here): **the replay is bit-identical to eager**. Recording runs a real eager step;
``Function.apply`` reports each op and the graph walk reports the order in which it ran each op's
backward and set each leaf's ``.grad`` (``program.py``). A replay calls the very same ``forward`` and
``backward`` methods on arrays in that order, summing gradients in the order eager summed them, running
the leaves' hooks (DDP's bucket all-reduces) at the same points and the end-of-pass callbacks after, and
updates AdamW as one in-place loop over shared scratch arrays (``fused.py``). Dropout draws
from minidist's generator inside the ops' ``forward``, in the same order, so it draws the same masks.
What the replay leaves out is the per-op bookkeeping and checks, not arithmetic; the guards
(``guards.py``) decide when it is valid, and any other call runs eagerly with a one-line reason.

Reading order: ``program.py`` (record, replay), ``kernels.py`` (ops a replay runs with fewer arrays),
``guards.py`` (when), ``fused.py`` (the optimizer), ``replay.py`` (``Replay``, the API).
"""

from minidist.compile.program import Program
from minidist.compile.replay import Replay, ReplayFallbackWarning

__all__ = ["Program", "Replay", "ReplayFallbackWarning"]
