"""A grading kernel's resource limits, and the step that applies them (standard library only).

``KernelLimits`` holds every limit of one kernel; ``c.Sandbox`` (``course/grader/settings.py``) fills the ones a TA may set.
``SandboxProvisioner`` (``course/grader/sandbox.py``) starts each kernel as
``python -I kernel_limits.py LIMITS_JSON -- COMMAND``: this script pins itself to the kernel's CPUs, lowers its
priority, sets its rlimits and moves into a cgroup of its own, then becomes ``COMMAND`` (bwrap, or the boot script),
which inherits all of it. It runs outside the sandbox (the cgroup tree is not visible inside) and before any student
code, so nothing the kernel starts escapes them. docs/SECURITY.md says what each limit stops.
"""
from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import resource
import sys
from pathlib import Path

SCRIPT = os.path.abspath(__file__)
CGROUP_PARENT = "efficient-ai"
CGROUP_PREFIX = "kernel-"


@dataclasses.dataclass(frozen=True)
class KernelLimits:
    """Every limit of one grading kernel, with the course's defaults (0 or empty: none).

    Attributes:
        cpus: CPUs the kernel runs on (its worker's share; empty: every CPU).
        address_space_bytes: RLIMIT_AS.
        file_size_bytes: RLIMIT_FSIZE, the largest file it may write.
        max_processes: processes and threads: RLIMIT_NPROC (counted for its own uid, so only when grading runs as
            root) and its cgroup's ``pids.max``.
        nice: how much lower than the grader's its CPU priority is.
        scratch_bytes: its private ``/tmp`` in memory (a bwrap argument, ``course/kernel/bwrap.py``).
        shm_bytes: its private ``/dev/shm`` (a bwrap argument).
    """

    cpus: tuple[int, ...] = ()
    address_space_bytes: int = 8 << 30
    file_size_bytes: int = 1 << 30
    max_processes: int = 1024
    nice: int = 5
    scratch_bytes: int = 1 << 30
    shm_bytes: int = 256 << 20

    def cpus_only(self) -> KernelLimits:
        """What a kernel outside the sandbox keeps: its CPUs (without the sandbox there are no caps)."""
        return dataclasses.replace(self, **{f.name: 0 for f in dataclasses.fields(self) if f.name != "cpus"})

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> KernelLimits:
        values = json.loads(text)
        return cls(**{**values, "cpus": tuple(values.get("cpus", ()))})

    def command(self, command: list[str]) -> list[str]:
        """``command`` run with these limits: through this script, or as it is when none applies to a process (the
        sizes of bwrap's folders are bwrap's arguments)."""
        if not any((self.cpus, self.address_space_bytes, self.file_size_bytes, self.max_processes, self.nice)):
            return list(command)
        return [sys.executable, "-I", SCRIPT, self.to_json(), "--", *command]

    def apply(self) -> None:
        """Apply every limit to this process (inherited across exec by what it becomes)."""
        if self.cpus and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, self.cpus)
        if self.max_processes:
            join_kernel_cgroup(self.max_processes)
        for limit, value in ((resource.RLIMIT_AS, self.address_space_bytes),
                             (resource.RLIMIT_FSIZE, self.file_size_bytes)):
            if value:
                resource.setrlimit(limit, (value, value))
        if self.address_space_bytes or self.file_size_bytes:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core dump of a capped kernel on the host's disk
        if self.max_processes and os.geteuid() == 0:  # counted per uid: root itself is exempt, the kernel's uid is not
            resource.setrlimit(resource.RLIMIT_NPROC, (self.max_processes, self.max_processes))
        if self.nice:
            os.nice(self.nice)


# cgroups: one per kernel, where a hierarchy with the cpu and pids controllers is writable (cgroup v2, or v1).
def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _cgroup_bases() -> list[tuple[str, str]]:
    """(folder of this process's cgroup, "v1" or "v2") for each hierarchy that can hold kernel cgroups."""
    try:
        with open("/proc/self/mountinfo") as handle:
            mounts = [line.split() for line in handle]
        with open("/proc/self/cgroup") as handle:
            own = [line.rstrip("\n").split(":", 2) for line in handle]
    except OSError:
        return []
    bases = []
    for fields in mounts:
        dash = fields.index("-")
        fstype, root, point, options = fields[dash + 1], fields[3], fields[4], set(fields[dash + 3].split(","))
        for _, controllers, path in own:
            v2 = fstype == "cgroup2" and not controllers
            v1 = fstype == "cgroup" and set(controllers.split(",")) & {"cpu", "pids"} & options
            if (v1 or v2) and _inside(path, root):
                bases.append((os.path.normpath(os.path.join(point, os.path.relpath(path, root))), "v2" if v2 else "v1"))
    return bases


def join_kernel_cgroup(max_processes: int) -> None:
    """Move this process (soon the kernel) into a fresh cgroup of its own in each hierarchy: a pids cap and an equal
    CPU share. Best effort: where none is writable, RLIMIT_NPROC alone caps processes."""
    for base, version in _cgroup_bases():
        parent = os.path.join(base, CGROUP_PARENT)
        with contextlib.suppress(OSError):
            if version == "v2":
                if not {"cpu", "pids"} <= set(Path(base, "cgroup.controllers").read_text().split()):
                    continue
                Path(base, "cgroup.subtree_control").write_text("+cpu +pids")
            os.makedirs(parent, exist_ok=True)
            if version == "v2":
                Path(parent, "cgroup.subtree_control").write_text("+cpu +pids")
            for stale in glob.glob(os.path.join(parent, CGROUP_PREFIX + "*")):
                with contextlib.suppress(OSError):
                    os.rmdir(stale)  # only an empty cgroup goes: its kernel is gone
            group = os.path.join(parent, f"{CGROUP_PREFIX}{os.getpid()}")
            os.makedirs(group, exist_ok=True)
            if os.path.exists(os.path.join(group, "pids.max")):
                Path(group, "pids.max").write_text(str(max_processes))
            Path(group, "cgroup.procs").write_text(str(os.getpid()))


def main(argv: list[str]) -> None:
    """``LIMITS_JSON -- COMMAND...``: apply the limits, then become the command."""
    if len(argv) < 3 or argv[1] != "--":
        raise SystemExit("usage: python -I kernel_limits.py LIMITS_JSON -- COMMAND...")
    KernelLimits.from_json(argv[0]).apply()
    os.execv(argv[2], argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
