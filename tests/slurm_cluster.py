"""A throw-away single-node Slurm cluster on loopback for tests (Debian's ``slurm-wlm`` and ``munge`` packages).

Everything lives in one temporary folder: a fresh munge key and a ``munged`` on its own socket, a generated
``slurm.conf`` (and ``gres.conf``) with free ports, ``slurmctld`` and one ``slurmd`` on 127.0.0.1. Clients find
the cluster through ``SLURM_CONF`` (see ``env``). The node declares two stand-in GPUs (empty files, no devices), so a
script asking for ``--gres=gpu:1`` runs unchanged on a machine without GPUs. Needs root: ``slurmd`` starts jobs
as the submitting user.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from pg_server import free_port

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "sinfo")
NODE_NAME = "gradenode"
NODE_CPUS = 8  # declared, not detected (config_overrides): lets jobs ask for more cores than this machine has
NODE_GPUS = 2  # stand-ins (empty files): Slurm sets SLURM_GPUS_ON_NODE and CUDA_VISIBLE_DEVICES; nothing is bound
MUNGE_KEY_BYTES = 128  # what mungekey generates by default (1024 bits)
START_TIMEOUT_S = 60.0


def missing_programs() -> list[str]:
    """The daemons and client commands this cluster needs that are not installed."""
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return [name for name in (*DAEMONS, *CLIENTS) if shutil.which(name, path=search) is None]


def _program(name: str) -> str:
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])) or name


def slurm_conf(folder: Path, controller_port: int, node_port: int, munge_socket: Path) -> str:
    """The text of a ``slurm.conf`` for one controller and one node on this host, state kept in ``folder``."""
    host = socket.gethostname().split(".")[0]
    return "\n".join([
        "ClusterName=efficientai-test",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={controller_port}",
        f"SlurmdPort={node_port}",
        "SlurmUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={folder / 'spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'slurmd.log'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        # No cgroups (a container running the tests may not delegate them): plain process tracking, no binding.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "MailProg=/bin/true",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",  # array tasks share the node core by core
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "GresTypes=gpu",
        f"NodeName={NODE_NAME} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={NODE_CPUS} Gres=gpu:{NODE_GPUS} "
        "State=UNKNOWN",
        f"PartitionName=grading Nodes={NODE_NAME} Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


class SlurmCluster:
    """munged, slurmctld and slurmd in a temporary folder; ``env`` points Slurm's client commands at them."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="slurm-test-"))
        os.chmod(self.dir, 0o700)
        self.conf = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "munge" / "munge.socket"
        self.processes: list[subprocess.Popen] = []

    @property
    def env(self) -> dict[str, str]:
        """The environment Slurm's commands (sbatch, squeue...) need to reach this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self) -> "SlurmCluster":
        """Start munged, slurmctld and slurmd; return once the node is idle.

        Raises:
            RuntimeError: a daemon did not come up within START_TIMEOUT_S (its log is in the message).
        """
        self._start_munged()
        (self.dir / "state").mkdir()
        (self.dir / "spool").mkdir()
        self.conf.write_text(slurm_conf(self.dir, free_port(), free_port(), self.munge_socket))
        self._write_gres_conf()
        self._spawn([_program("slurmctld"), "-D", "-i", "-f", str(self.conf)], "slurmctld.out")
        self._spawn([_program("slurmd"), "-D", "-N", NODE_NAME, "-f", str(self.conf)], "slurmd.out")
        self._wait_for_idle_node()
        return self

    def _write_gres_conf(self) -> None:
        """Stand-in GPUs: Slurm drops a GPU without a device file, so each one is an empty file here."""
        devices = self.dir / "dev"
        devices.mkdir()
        for index in range(NODE_GPUS):
            (devices / f"fakegpu{index}").touch()
        gpu_files = devices / f"fakegpu[0-{NODE_GPUS - 1}]"
        (self.dir / "gres.conf").write_text(f"NodeName={NODE_NAME} Name=gpu File={gpu_files}\n")

    def _start_munged(self) -> None:
        munge = self.munge_socket.parent
        munge.mkdir(mode=0o700)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(MUNGE_KEY_BYTES))
        os.chmod(key, 0o400)
        self._spawn([_program("munged"), "--foreground", "--force", f"--key-file={key}", f"--socket={self.munge_socket}",
                     f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}",
                     f"--seed-file={munge / 'munged.seed'}"], "munged.out")
        self._wait(lambda: self.munge_socket.exists(), "munged", munge / "munged.log")

    def _spawn(self, argv: list[str], log_name: str) -> None:
        with open(self.dir / log_name, "wb") as log:
            self.processes.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env))

    def _wait_for_idle_node(self) -> None:
        def idle() -> bool:
            result = subprocess.run([_program("sinfo"), "-h", "-N", "-o", "%T"], capture_output=True, text=True,
                                    env=self.env, timeout=30)
            return result.returncode == 0 and result.stdout.strip() == "idle"
        self._wait(idle, "slurmctld and slurmd", self.dir / "slurmd.log")

    def _wait(self, ready, what: str, log: Path) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if ready():
                return
            dead = [p.args[0] for p in self.processes if p.poll() is not None]
            if dead:
                break
            time.sleep(0.5)
        logs = "\n".join(f"--- {path.name}\n{path.read_text()[-1500:]}" for path in sorted(self.dir.rglob("*.log"))
                         if path.is_file())
        self.stop()
        raise RuntimeError(f"{what} did not start within {START_TIMEOUT_S:.0f} s (exited: {dead or 'none'})\n{logs}")

    def sbatch(self, args: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess:
        """Run ``sbatch ARGS`` against this cluster from ``cwd`` (add ``--wait`` to block until the job ends)."""
        return subprocess.run([_program("sbatch"), *args], cwd=cwd, env={**env, "SLURM_CONF": str(self.conf)},
                              capture_output=True, text=True, timeout=timeout_s)

    def log(self, name: str) -> str:
        """The text of one of the daemons' logs (``slurmctld.log``, ``slurmd.log``), or '' when absent."""
        path = self.dir / name
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        """Stop the daemons (slurmd first) and remove the folder."""
        for process in reversed(self.processes):
            process.terminate()
        for process in reversed(self.processes):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        self.processes.clear()
        shutil.rmtree(self.dir, ignore_errors=True)
