"""The Slurm part of the cluster in a box without root or Slurm: its slurm.conf, and installing the
packages when a program is missing (with a stand-in install script)."""

from __future__ import annotations

from pathlib import Path

import pytest

from minidist_tools.cluster import ClusterError
from minidist_tools.cluster.slurm import config, packages

RECORD = {
    "name": "md3",
    "subnet": 3,
    "nodes": ["md3n0", "md3n1"],
    "addresses": ["198.18.3.10", "198.18.3.11"],
    "bridge_ip": "198.18.3.1",
    "ranks_per_node": 2,
}


def test_slurm_conf_names_the_controller_on_the_bridge_and_each_node_with_its_ranks(tmp_path):
    record = {**RECORD, "slurm": config.plan(RECORD, tmp_path / "md3.slurm")}
    text = config.slurm_conf(record)
    assert "SlurmctldHost=md3ctl(198.18.3.1)\n" in text
    assert f"SlurmctldPort={config.BASE_PORT + 3}\n" in text  # one port per subnet: controllers share a host
    assert f"AuthInfo=socket={tmp_path / 'md3.slurm' / 'munge.sock'},cred_expire=10\n" in text
    assert "NodeName=md3n0 NodeAddr=198.18.3.10 CPUs=2 State=UNKNOWN\n" in text
    assert "NodeName=md3n1 NodeAddr=198.18.3.11 CPUs=2 State=UNKNOWN\n" in text
    assert all(str(tmp_path) in line for line in text.splitlines() if "File=" in line or "Dir=" in line)
    config.write(record)
    assert (tmp_path / "md3.slurm" / "slurm.conf").read_text() == text
    assert (tmp_path / "md3.slurm" / "spool" / "md3n1").is_dir()
    assert "export UCX_TLS=tcp,self" in (tmp_path / "md3.slurm" / "task_prolog.sh").read_text()


@pytest.mark.parametrize("works", [True, False])
def test_missing_programs_are_installed_saying_so(tmp_path, monkeypatch, works):
    script = tmp_path / "install_slurm.sh"
    script.write_text(f"echo installing; exit {0 if works else 3}\n")
    monkeypatch.setattr(packages, "INSTALL_SCRIPT", Path(script))
    answers = iter([["sbatch", "slurmd"], [] if works else ["sbatch"]])  # before and after the script
    monkeypatch.setattr(packages, "missing", lambda: next(answers))
    said = []
    if works:
        packages.ensure_installed(said.append)
        assert said[-1] == "Slurm and munge are installed."
    else:
        with pytest.raises(ClusterError, match=r"installing Slurm failed \(exit 3, missing \['sbatch'\]\)"):
            packages.ensure_installed(said.append)
    assert said[0].startswith(
        "Slurm is not installed (missing: sbatch, slurmd): installing slurm-wlm and munge"
    )
