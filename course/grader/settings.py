"""The settings a TA may change beside nbgrader's own: ``c.Sandbox``, and the environment variables that override an
option of ``nbgrader_config.py`` for one run (read here and nowhere else). docs/SETTINGS.md lists them all.
"""
from __future__ import annotations

import dataclasses
import os

from traitlets import Enum, Float, Integer, List
from traitlets.config import Configurable

from ..kernel.kernel_limits import KernelLimits

GIB = 1 << 30
MIB = 1 << 20
_DEFAULT = KernelLimits()  # the course's limits: KernelLimits holds each default once


class Sandbox(Configurable):
    """Where and how grading kernels run (course/grader/sandbox.py, docs/SECURITY.md). ``limits`` turns these options into
    the ``KernelLimits`` a kernel starts with."""

    mode = Enum(
        ["auto", "on", "off"], default_value="auto",
        help="'auto': sandbox every grading kernel in bubblewrap where it works, else warn once and start kernels "
             "isolated but unsandboxed; 'on': refuse to grade without the sandbox; 'off': no sandbox (the isolated "
             "start stays).",
    ).tag(config=True)
    memory_gb = Float(
        _DEFAULT.address_space_bytes / GIB,
        help="Address-space cap of one kernel (GiB; 0: none). Not applied where CUDA devices are present.",
    ).tag(config=True)
    scratch_mb = Integer(
        _DEFAULT.scratch_bytes // MIB,
        help="Size of the kernel's private /tmp, in memory (MiB): HOME, TMPDIR and its working folder.",
    ).tag(config=True)
    max_processes = Integer(
        _DEFAULT.max_processes,
        help="Processes and threads one kernel may have (its own uid when grading runs as root, and its cgroup).",
    ).tag(config=True)
    cpus = List(
        Integer(), default_value=[],
        help="CPUs this process's grading kernels run on (empty: every CPU). course grade sets it per worker.",
    ).tag(config=True)

    def limits(self, cuda_devices: bool) -> KernelLimits:
        """The ``KernelLimits`` of a kernel started with these options; with ``cuda_devices`` present no address-space
        cap (CUDA reserves far more virtual memory than it uses)."""
        memory_bytes = 0 if cuda_devices else int(self.memory_gb * GIB)
        return dataclasses.replace(_DEFAULT, cpus=tuple(self.cpus), address_space_bytes=memory_bytes,
                                   scratch_bytes=self.scratch_mb * MIB, max_processes=self.max_processes)


# Variable -> (configurable, option, how its text is read): set, it overrides that option of nbgrader_config.py for
# the processes it reaches.
ENVIRONMENT = {
    "EFFICIENT_AI_SANDBOX": ("Sandbox", "mode", str),
    "EFFICIENT_AI_SANDBOX_MEMORY_GB": ("Sandbox", "memory_gb", float),
    "EFFICIENT_AI_SANDBOX_SCRATCH_MB": ("Sandbox", "scratch_mb", int),
    "EFFICIENT_AI_SANDBOX_MAX_PROCESSES": ("Sandbox", "max_processes", int),
    "EFFICIENT_AI_CELL_TIMEOUT_S": ("Execute", "timeout", int),
    "EFFICIENT_AI_OUTPUT_WAIT_S": ("Execute", "iopub_timeout", int),
    "EFFICIENT_AI_NOTEBOOK_TIMEOUT_S": ("GuardedExecute", "notebook_timeout_s", float),
    "EFFICIENT_AI_GUARD": ("GuardedExecute", "guard", bool),
}
SWITCHES = {"on": True, "true": True, "1": True, "yes": True, "off": False, "false": False, "0": False, "no": False}


def override(name: str):
    """The value variable ``name`` sets (parsed for its option), or None when it is not set.

    Raises:
        SystemExit: a switch that is not on/off (or true/false, 1/0, yes/no), or a number that is not one.
    """
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    section, option, kind = ENVIRONMENT[name]
    if kind is bool:
        if text.lower() not in SWITCHES:
            raise SystemExit(f"{name} must be on or off, got {text!r}")
        return SWITCHES[text.lower()]
    if kind is str:  # the sandbox mode; an unknown one fails safe
        return text.lower() if text.lower() in ("auto", "on", "off") else "on"
    try:
        return kind(float(text))
    except ValueError:
        raise SystemExit(f"{name} must be a number, got {text!r}") from None


def apply_environment(c, sections: tuple[str, ...] | None = None) -> None:
    """Set on config ``c`` every option whose variable is set (only those of ``sections``, when given)."""
    for name, (section, option, _) in ENVIRONMENT.items():
        value = override(name)
        if value is not None and (sections is None or section in sections):
            c[section][option] = value


def sandbox_mode() -> str:
    """The sandbox mode ``course grade`` checks before grading: ``EFFICIENT_AI_SANDBOX``, else ``auto``
    (``c.Sandbox.mode`` of the course's nbgrader_config.py then decides in each nbgrader process)."""
    return override("EFFICIENT_AI_SANDBOX") or "auto"
