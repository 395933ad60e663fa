"""Reference answers (and wrong answers the checks must reject) for lesson 12. See lessons/README.md."""
# ruff: noqa: F811


# %% [solution linkbytes]
def inter_node_bytes(nbytes, nodes, ranks_per_node, algorithm):
    if nodes == 1:
        return 0.0
    ring = nodes * ranks_per_node if algorithm == "ring" else nodes  # who forms the ring
    return 2 * (ring - 1) / ring * nbytes  # one ring edge leaves each node; it carries this much


# %% [wrong linkbytes]
def inter_node_bytes(nbytes, nodes, ranks_per_node, algorithm):
    ring = nodes * ranks_per_node if algorithm == "ring" else nodes
    per_rank = 2 * (ring - 1) / ring * nbytes
    return per_rank * (ranks_per_node if algorithm == "ring" else 1)  # as if every rank's bytes left the node


# %% [wrong linkbytes]
def inter_node_bytes(nbytes, nodes, ranks_per_node, algorithm):
    if nodes == 1:
        return 0.0
    n = nodes * ranks_per_node
    return 2 * (n - 1) / n * nbytes  # the hierarchical all-reduce is not a ring over all the ranks


# %% [wrong linkbytes]
def inter_node_bytes(nbytes, nodes, ranks_per_node, algorithm):
    ring = nodes * ranks_per_node if algorithm == "ring" else nodes
    return 2 * (ring - 1) / ring * nbytes  # one node sends nothing to others


# %% [solution powersgd]
def powersgd_values(shapes, rank, min_compression_rate):
    total = 0
    for shape in shapes:
        m = shape[0]
        n = 1
        for d in shape[1:]:
            n *= d  # a 4-D convolution kernel is a matrix of its first dimension by the rest
        factors = m * rank + n * rank  # P is m x rank, Q is n x rank
        if len(shape) >= 2 and factors * min_compression_rate < m * n:
            total += factors
        else:
            total += m * n  # biases, and matrices too small to pay, go as they are
    return total


# %% [wrong powersgd]
def powersgd_values(shapes, rank, min_compression_rate):
    total = 0
    for shape in shapes:
        m, n = shape[0], 1
        for d in shape[1:]:
            n *= d
        total += (m + n) * rank if len(shape) >= 2 else m  # compresses every matrix, paying or not
    return total


# %% [wrong powersgd]
def powersgd_values(shapes, rank, min_compression_rate):
    total = 0
    for shape in shapes:
        m, n = shape[0], 1
        for d in shape[1:]:
            n *= d
        small = m * n <= (m + n) * rank * min_compression_rate
        total += m * n if len(shape) < 2 or small else m * rank  # forgets Q
    return total


# %% [wrong powersgd]
def powersgd_values(shapes, rank, min_compression_rate):
    total = 0
    for shape in shapes:
        m, n = shape[0], shape[-1]  # the last dimension, not all but the first
        factors = (m + n) * rank
        total += factors if len(shape) >= 2 and factors * min_compression_rate < m * n else m * n
    return total
