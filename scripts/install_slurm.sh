#!/bin/sh
# Install what `minidist cluster up --scheduler slurm` needs from the distribution's packages (Debian and
# Ubuntu): Slurm (slurmctld, slurmd and the client commands srun, sbatch, salloc, scontrol, sinfo) and
# munge, the daemon that signs every message between them. Needs root, like the cluster itself.
#
# The packages' own services stay stopped and disabled: the cluster in a box starts its own daemons, with
# its own configuration, in its own state folder, and stops them again on `down`.
set -eu
if [ "$(id -u)" != 0 ]; then
    echo "install_slurm.sh: run as root (apt-get installs system packages), e.g. sudo $0" >&2
    exit 2
fi
if ! command -v apt-get >/dev/null; then
    echo "install_slurm.sh: no apt-get here; install Slurm (slurmctld, slurmd, client) and munge with" \
         "this system's package manager" >&2
    exit 2
fi
export DEBIAN_FRONTEND=noninteractive
# policy-rc.d exit status 101: "do not start services" while the packages install (invoke-rc.d(8)).
policy=/usr/sbin/policy-rc.d
made_policy=no
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    made_policy=yes
fi
trap '[ "$made_policy" = yes ] && rm -f "$policy"' EXIT
apt-get update -q
apt-get install -y -q --no-install-recommends slurm-wlm munge
# The package makes the key on install; make one if an older package did not.
if [ ! -s /etc/munge/munge.key ]; then
    if command -v mungekey >/dev/null; then mungekey --create; else
        dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; fi
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
fi
echo "install_slurm.sh: installed $(slurmctld -V 2>/dev/null || echo slurm) and munge"
