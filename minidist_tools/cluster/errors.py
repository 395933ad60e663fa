"""The one exception of :mod:`minidist_tools.cluster`, and the check that says whether a cluster can be
made."""

from __future__ import annotations

import os
import shutil
import sys

from minidist_tools.mpiexec import mpiexec_path  # the one mpiexec finder; imports no MPI


class ClusterError(RuntimeError):
    """A cluster could not be made, found, used or removed; the message says what to do.

    The CLI prints it and exits with status 2 (bad input or missing privileges).
    """


# Linux capability numbers (include/uapi/linux/capability.h): network namespaces, veth pairs, bridges
# and tc need CAP_NET_ADMIN; `ip netns add` bind-mounts the namespace file and `unshare --uts` makes a
# UTS namespace, both need CAP_SYS_ADMIN.
_CAP_NET_ADMIN = 12
_CAP_SYS_ADMIN = 21


def _effective_capabilities() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def cluster_available() -> tuple[bool, str]:
    """Whether this machine can host a cluster in a box, and if not, why: ``(ok, reason)``.

    Checks (cheaply, changing nothing): Linux, the ``ip``, ``tc`` and ``unshare`` programs, ``mpiexec``,
    and the CAP_NET_ADMIN and CAP_SYS_ADMIN capabilities (root has them, unless a container took them away).
    ``reason`` is ``""`` when ``ok``; tests skip with it and the CLI exits 2 printing it.
    """
    if not os.path.exists("/proc/self/status"):
        return False, "network namespaces need Linux (/proc/self/status is missing)"
    for program, package in (("ip", "iproute2"), ("tc", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(program) is None:
            return False, f"the `{program}` program is missing: install {package}"
    try:
        mpiexec_path()
    except RuntimeError as error:
        return False, str(error)
    caps = _effective_capabilities()
    for bit, name in ((_CAP_NET_ADMIN, "CAP_NET_ADMIN"), (_CAP_SYS_ADMIN, "CAP_SYS_ADMIN")):
        if not caps >> bit & 1:
            return False, (
                f"needs root ({name}) to make network namespaces: run as root, e.g. `sudo "
                f"{sys.executable} -m minidist_tools.cluster ...` (this environment's Python), or in a "
                "container started with --cap-add NET_ADMIN --cap-add SYS_ADMIN"
            )
    return True, ""
