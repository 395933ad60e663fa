"""A cluster in a box: several "machines" (network namespaces) on one Linux host, linked over real TCP.

``minidist cluster up --nodes 2 --ranks-per-node 2`` then ``minidist cluster run --
python examples/train_mlp.py`` runs an MPI job whose ranks sit on two nodes and talk over veth links that
can be shaped to a chosen speed (``--bandwidth 1gbit``); ``status`` and ``down`` complete it. In Python::

    from minidist_tools.cluster import Cluster, ClusterError, cluster_available
    with Cluster.up(nodes=2, ranks_per_node=2) as c:
        c.run(["python", "examples/train_mlp.py"])

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), ``ip``/``tc`` (iproute2) and ``unshare`` (util-linux);
:func:`cluster_available` says whether they are there. Files: cluster.py (the ``Cluster`` class),
netns.py (namespaces, veth, bridge), shaping.py (tc tbf), state.py (state files, lock, subnets),
launch.py (how mpiexec reaches the namespaces), __main__.py (the command line).
"""

from minidist_tools.cluster.cluster import Cluster
from minidist_tools.cluster.errors import ClusterError, cluster_available

__all__ = ["Cluster", "ClusterError", "cluster_available"]
