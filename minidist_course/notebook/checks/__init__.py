"""The checks of the lessons' "your turn" exercises: ``from minidist_course.notebook import checks``.

Each exercise of ``lessons/NN_name.ipynb`` is a cell holding a placeholder, followed by a check cell
such as ``checks.ring_time(ring_time)``. A check prints ``NOT DONE YET`` for an untouched placeholder (so
a notebook runs top to bottom before any exercise is done), ``CORRECT`` and what it checked for a right
answer, and raises ``AssertionError`` for a wrong one, naming the input that failed, the answer and the
property of the right answer it breaks (not the expected value, which only a third miss shows), with a
hint that escalates: a question on the first miss, a nudge after, never the formula
(:mod:`minidist_course.notebook.checks.harness`; ``reset_hints()`` starts the count over).

The checks live in the installed package, one module per lesson, not beside the notebooks: a student
browsing their copy of the lessons in Jupyter does not come across the code that computes the expected
values. (Nothing here is secret, as ``minidist/distributed/algorithms/ring.py`` is not: it is code to read
after trying.) :func:`yours_or_minidists` gives the cells after an exercise the student's function once it
passes, minidist's until then; :func:`stand_in` gives minidist's whatever the student wrote.
"""

from minidist_course.notebook.checks.harness import reset_hints
from minidist_course.notebook.checks.lesson01_autograd import numerical_grad, tanh_backward
from minidist_course.notebook.checks.lesson02_mpi import ring_neighbors, ring_pass
from minidist_course.notebook.checks.lesson03_ring_allreduce import reduce_scatter_send_chunk, ring_time
from minidist_course.notebook.checks.lesson04_data_parallel import microbatch_weight
from minidist_course.notebook.checks.lesson05_zero import zero_bytes
from minidist_course.notebook.checks.lesson06_tensor_parallel import f_and_g, tp_shard_shape
from minidist_course.notebook.checks.lesson07_pipeline_parallel import bubble_fraction, peak_activations_1f1b
from minidist_course.notebook.checks.lesson08_checkpoints import files_before_latest, shards_needed
from minidist_course.notebook.checks.lesson09_scaling import dp_speedup, mesh_rank
from minidist_course.notebook.checks.lesson10_transformer import (
    count_flops,
    count_parameters,
    layer_norm_backward,
)
from minidist_course.notebook.checks.lesson11_transformer_parallelism import (
    mesh_rank4,
    online_attention,
    tp_bytes_per_layer,
    vocab_parallel_loss,
)
from minidist_course.notebook.checks.lesson12_network_bottleneck import inter_node_bytes, powersgd_values
from minidist_course.notebook.checks.lesson13_failures import system_mtbf, waits, young_interval
from minidist_course.notebook.checks.lesson14_memory import block_activation_bytes
from minidist_course.notebook.checks.stand_ins import stand_in, yours_or_minidists

__all__ = [
    "block_activation_bytes",
    "bubble_fraction",
    "count_flops",
    "count_parameters",
    "dp_speedup",
    "f_and_g",
    "files_before_latest",
    "inter_node_bytes",
    "layer_norm_backward",
    "mesh_rank",
    "mesh_rank4",
    "microbatch_weight",
    "numerical_grad",
    "online_attention",
    "peak_activations_1f1b",
    "powersgd_values",
    "reduce_scatter_send_chunk",
    "reset_hints",
    "ring_neighbors",
    "ring_pass",
    "ring_time",
    "shards_needed",
    "stand_in",
    "system_mtbf",
    "tanh_backward",
    "tp_bytes_per_layer",
    "tp_shard_shape",
    "vocab_parallel_loss",
    "waits",
    "young_interval",
    "yours_or_minidists",
    "zero_bytes",
]
