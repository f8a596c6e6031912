"""How grading kernels start (course/grader/sandbox.py's provisioner, course/kernel/kernel_limits.py, course/kernel/bwrap.py): isolated on
their worker's CPUs with the sandbox off or missing, in bwrap with c.Sandbox's limits where it works, refused when the
sandbox is required and missing; no kernelspec file is written and JUPYTER_PATH is left alone. tests/test_sandbox.py
grades through the sandbox for real.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
from pathlib import Path

import pytest
from jupyter_client import KernelManager
from jupyter_client.provisioning import KernelProvisionerFactory
from traitlets.config import Config

from course.grader import sandbox
from course.kernel import bwrap
from course.kernel.kernel_limits import SCRIPT as LIMITS_SCRIPT
from course.kernel.kernel_limits import KernelLimits


def course_config(tmp_path: Path, mode: str, **options) -> Config:
    """A config as nbgrader_config.py makes it, for a course in ``tmp_path`` whose lab0 has instructor files."""
    (tmp_path / "source" / "lab0").mkdir(parents=True, exist_ok=True)
    (tmp_path / "source" / "lab0" / "utils.py").write_text("ANSWER = 42\n")
    (tmp_path / "source" / "lab0" / "lab0.ipynb").write_text("{}")  # holds solutions: never copied to the kernel
    (tmp_path / "submitted" / "s" / "lab0").mkdir(parents=True, exist_ok=True)
    config = Config()
    config.CourseDirectory.root = str(tmp_path)
    config.Sandbox.mode = mode
    for name, value in options.items():
        config.Sandbox[name] = value
    return config


def prepared_command(config: Config, cwd: Path) -> tuple[list[str], KernelManager]:
    """The command a grading kernel would start with (jupyter_client's pre-start), and its kernel manager."""
    km = KernelManager(config=config)
    sandbox.use_sandbox(km)
    command, _ = km.pre_start_kernel(cwd=str(cwd), extra_arguments=["--HistoryManager.hist_file=:memory:"])
    return command, km


def limits_in(command: list[str]) -> KernelLimits:
    assert command[1:3] == ["-I", LIMITS_SCRIPT], command
    return KernelLimits.from_json(command[3])


def test_the_provisioner_is_registered_and_named_by_the_grading_kernelspec():
    spec = sandbox.GradingKernelSpecs().get_kernel_spec("whatever-a-notebook-names")
    factory = KernelProvisionerFactory.instance()
    assert factory.is_provisioner_available(spec), "pip install -e . registers the jupyter_client entry point"
    provisioner = factory.create_provisioner_instance("k", spec, parent=KernelManager())
    assert isinstance(provisioner, sandbox.SandboxProvisioner)
    assert spec.interrupt_mode == "message", "a sandboxed kernel has a session of its own: SIGINT cannot reach it"


def test_limits_round_trip_and_only_cpus_stay_outside_the_sandbox():
    limits = sandbox.Sandbox(config=course_config(Path("/nonexistent"), "on", memory_gb=2.0, cpus=[1])).limits(False)
    assert limits.address_space_bytes == 2 << 30 and limits.cpus == (1,)
    assert KernelLimits.from_json(limits.to_json()) == limits
    assert limits.cpus_only() == KernelLimits(cpus=(1,), address_space_bytes=0, file_size_bytes=0, max_processes=0,
                                              nice=0, scratch_bytes=0, shm_bytes=0)
    assert sandbox.Sandbox().limits(cuda_devices=True).address_space_bytes == 0, "CUDA reserves huge address ranges"
    assert KernelLimits().cpus_only().command(["x"]) == ["x"], "nothing to apply: no extra process"


def test_an_unsandboxed_kernel_starts_isolated_on_its_worker_s_cpus(tmp_path, monkeypatch):
    everywhere = sorted(os.sched_getaffinity(0))
    monkeypatch.setenv("JUPYTER_PATH", "unchanged")
    config = course_config(tmp_path, "off", cpus=everywhere[-1:])
    km = KernelManager(config=config)
    sandbox.use_sandbox(km)
    km.start_kernel(cwd=str(tmp_path / "submitted" / "s" / "lab0"))
    client, printed = km.client(), []
    try:
        client.start_channels()
        client.wait_for_ready(timeout=60)
        probe = ("import os, utils\n"
                 "print(sorted(os.sched_getaffinity(0)), utils.ANSWER, os.path.exists('lab0.ipynb'))")
        reply = client.execute_interactive(probe, timeout=60, output_hook=printed.append)
    finally:
        client.stop_channels()
        folder = km.provisioner.folder
        km.shutdown_kernel(now=True)
    text = "".join(m["content"].get("text", "") for m in printed if m["msg_type"] == "stream")
    assert reply["content"]["status"] == "ok", text
    assert text.strip() == f"{everywhere[-1:]} 42 False", (
        f"the kernel runs on its worker's CPUs, imports the instructor's utils.py, has no notebook beside it: {text!r}")
    assert os.environ["JUPYTER_PATH"] == "unchanged" and km.transport == "tcp"
    assert folder and not os.path.exists(folder), "the kernel's folder goes with it"


def test_without_bwrap_auto_warns_and_starts_isolated_and_on_refuses(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", "")  # no bwrap to be found
    sandbox._say_once.cache_clear()
    with pytest.raises(SystemExit, match="cannot be sandboxed: bubblewrap is not installed"):
        sandbox.configure_sandbox(course_config(tmp_path, "on"))
    config = course_config(tmp_path, "auto")
    sandbox.configure_sandbox(config)
    assert "grading is NOT sandboxed" in capsys.readouterr().err
    command, km = prepared_command(config, tmp_path / "submitted" / "s" / "lab0")
    try:
        assert command[command.index(bwrap.BOOT_SCRIPT) - 1] == "-I" and "bwrap" not in " ".join(command), command
        assert km.transport == "tcp" and "--on-path" in command, command
        files = Path(command[command.index("--files") + 1])
        assert sorted(p.name for p in files.iterdir()) == ["utils.py"], "only the instructor files, no notebook"
    finally:
        km.cleanup_resources()


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")
def test_a_sandboxed_kernel_gets_c_sandbox_s_limits_over_ipc(tmp_path):
    assert sandbox.unavailable_reason() is None
    config = course_config(tmp_path, "on", memory_gb=1.5, max_processes=99, scratch_mb=64, cpus=[0])
    command, km = prepared_command(config, tmp_path / "submitted" / "s" / "lab0")
    try:
        limits = limits_in(command)
        memory_bytes = 0 if glob.glob("/dev/nvidia[0-9]*") else int(1.5 * (1 << 30))  # no cap beside CUDA
        assert (limits.address_space_bytes, limits.max_processes, limits.scratch_bytes, limits.cpus) == (
            memory_bytes, 99, 64 << 20, (0,)), limits
        assert command[5].endswith("bwrap") and "--unshare-net" in command, command
        assert command[command.index("--tmpfs", command.index(str(64 << 20))) + 1] == bwrap.SCRATCH_DIR
        assert km.transport == "ipc" and json.loads(Path(km.connection_file).read_text())["transport"] == "ipc"
        assert ("--uid" in command) == (os.geteuid() == 0), command
        kernel_args = command[command.index(bwrap.BOOT_PATH):]
        assert kernel_args[-3:] == ["-f", bwrap.CONNECTION_PATH, "--HistoryManager.hist_file=:memory:"], command
    finally:
        km.cleanup_resources()
