"""The collective algorithms, one file each, written with point-to-point messages only.

Reading order: ``ring.py`` (reduce-scatter, all-gather, all-reduce around a ring) ->
``recursive_doubling.py`` (all-reduce for short messages; folding a group to a power of two) ->
``rabenseifner.py`` (all-reduce for long messages in ``2 log2 n`` steps) -> ``recursive_halving.py``
(reduce-scatter in ``log2 n`` steps) -> ``tree_broadcast.py`` (binomial tree) -> ``scatter_allgather.py``
(broadcast for long messages) -> ``tree_reduce.py`` (binomial-tree reduce to one rank) ->
``hierarchical.py`` (all-reduce inside nodes, then across them) -> ``mpi_builtin.py`` (MPI's own
collectives, the reference every algorithm here is tested against).

Each works in place on a flat host (NumPy) array, is collective over its group, and talks over the
group's ``collective_channel`` (``comm.py``). ``collectives.py`` checks the arguments, picks one of
these by message size (``tuning.py``) and runs it.
"""
