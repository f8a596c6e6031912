"""What a sandboxed grading kernel sees: bubblewrap's command line (the allow-list of docs/SECURITY.md, "sandbox").

Pure construction: ``kernel_command`` returns the bwrap command that runs ``kernel_boot.py`` for one kernel (and writes
that kernel's ``passwd``, ``group`` and private connection file), ``sandbox_args`` the part the kernel and
``course.grader.sandbox``'s probe share. Needs bubblewrap 0.7 or newer (``--size``).
"""
from __future__ import annotations

import glob
import os
import shutil
import sys
from pathlib import Path

from .kernel_limits import KernelLimits

BOOT_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_boot.py")
HIDDEN_TMPFS_BYTES = 1 << 20  # the empty folder laid over a course folder inside an allowed tree
COMPILER_ENV = ("CC", "CXX")  # the C and C++ compilers Triton and torch.compile call, where the grader names them
COMPILER_NAMES = ("cc", "gcc", "c++", "g++", "clang")  # what they look for on PATH otherwise

# Inside the sandbox.
RUN_DIR = "/run/efficient-ai"
FILES_DIR = RUN_DIR + "/files"
BOOT_PATH = RUN_DIR + "/kernel_boot.py"
CONNECTION_PATH = RUN_DIR + "/connection.json"
SCRATCH_DIR = "/tmp"
WORK_DIR = SCRATCH_DIR + "/work"
SYSTEM_TREES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_KEEP = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime",
            "/etc/timezone", "/etc/nsswitch.conf", "/etc/host.conf", "/etc/hosts", "/etc/os-release", "/etc/fonts",
            "/etc/mime.types")
ENV_KEEP = ("PATH", "LANG", "LANGUAGE", "TZ", "EFFICIENT_AI_SCALE", "MPLBACKEND", "PYTHONUNBUFFERED", "PYTHONHASHSEED",
            "PYTHONDONTWRITEBYTECODE", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_HOME",
            "NVIDIA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
            "TRITON_INTERPRET", "PYTORCH_CUDA_ALLOC_CONF", "CC", "CXX")
ENV_KEEP_PREFIXES = ("LC_",)


def inside(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or lies under it (by name)."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _outermost(paths: list[str]) -> list[str]:
    return [p for p in paths if not any(p != o and inside(p, o) for o in paths)]


def installed_dirs() -> list[str]:
    """The folders outside ``SYSTEM_TREES`` a kernel runs from: the Python installation (venv and base, as named and
    resolved) and the C compilers' (``_toolchain_dirs``)."""
    python = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, os.path.dirname(sys.executable)}
    python |= {os.path.realpath(d) for d in python} | {os.path.dirname(os.path.realpath(sys.executable))}
    outside = {d for d in python if not any(inside(d, tree) for tree in SYSTEM_TREES)}
    return _outermost(sorted(outside | set(_toolchain_dirs())))


def _toolchain_dirs() -> list[str]:
    """The folders outside ``SYSTEM_TREES`` of the C/C++ compilers ``CC``, ``CXX`` or PATH name (Triton and
    torch.compile call one): its folder, or PREFIX for ``PREFIX/bin``; never a top-level folder or one holding HOME."""
    home = os.path.realpath(os.path.expanduser("~"))
    dirs = set()
    for name in [*(os.environ[k] for k in COMPILER_ENV if os.environ.get(k)), *COMPILER_NAMES]:
        found = shutil.which(name, path=os.environ.get("PATH", os.defpath))
        for binary in {found, os.path.realpath(found)} if found else ():
            folder = os.path.dirname(os.path.abspath(binary))
            prefix = os.path.dirname(folder) if os.path.basename(folder) == "bin" else folder
            if (prefix.count("/") >= 2 and not any(inside(prefix, tree) for tree in SYSTEM_TREES)
                    and not inside(home, prefix)):
                dirs.add(prefix)
    return sorted(dirs)


def _parent_dirs(destinations: list[str], under: str = "/") -> list[str]:
    """bwrap arguments making every folder between ``under`` and each destination, parents first, mode 0755 (bwrap's
    0700 would stop the kernel's own uid)."""
    parents = set()
    for path in destinations:
        parent = os.path.dirname(path)
        while parent != os.path.dirname(parent) and parent != under and inside(parent, under):
            parents.add(parent)
            parent = os.path.dirname(parent)
    ordered = sorted(parents, key=lambda p: (p.count("/"), p))
    return [arg for folder in ordered for arg in ("--perms", "0755", "--dir", folder)]


def _installed_args(installed: list[str], in_scratch: bool) -> list[str]:
    """bwrap arguments showing the ``installed`` folders inside ``SCRATCH_DIR`` (``in_scratch``: they must follow
    the scratch tmpfs, which would hide them) or the others read-only."""
    chosen = [d for d in installed if inside(d, SCRATCH_DIR) == in_scratch]
    args = _parent_dirs(chosen, SCRATCH_DIR if in_scratch else "/")
    for folder in chosen:
        args += ["--ro-bind", folder, folder]
    return args


def _system_args() -> list[str]:
    """bwrap, its namespaces, and the read-only system trees and files of ``/etc`` every sandbox shows."""
    args = [shutil.which("bwrap") or "bwrap", *([] if os.geteuid() == 0 else ["--unshare-user"]), "--unshare-pid",
            "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent",
            "--new-session", *_parent_dirs([p for p in ETC_KEEP if os.path.exists(p)])]
    for tree in SYSTEM_TREES:  # links stay links
        if os.path.islink(tree):
            args += ["--symlink", os.readlink(tree), tree]
        elif os.path.isdir(tree):
            args += ["--ro-bind", tree, tree]
    for path in ETC_KEEP:
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


def _environment_args(env: dict[str, str]) -> list[str]:
    """bwrap arguments replacing the environment with the whitelisted part of ``env`` and the sandbox's own."""
    kept = {k: v for k, v in env.items() if k in ENV_KEEP or k.startswith(ENV_KEEP_PREFIXES)}
    # glibc reserves 64 MiB of address space per malloc arena (up to 8 per core): keep the cap meaningful.
    kept.update(HOME=SCRATCH_DIR, TMPDIR=SCRATCH_DIR, USER="kernel", LOGNAME="kernel", MALLOC_ARENA_MAX="4",
                JPY_PARENT_PID="1")  # the sandbox's init: ipykernel then neither polls its parent nor prints a banner
    args = ["--clearenv"]
    for key, value in sorted(kept.items()):
        args += ["--setenv", key, value]
    return args


def sandbox_args(installed: list[str], scratch_bytes: int, mounts: list[str], scratch_mounts: list[str],
                 hidden: list[str], env: dict[str, str]) -> list[str]:
    """bwrap, its namespaces and the allow-list the kernel and the probe share, up to the command.

    Args:
        installed: ``installed_dirs()``, shown read-only.
        scratch_bytes: size of the private tmpfs at ``SCRATCH_DIR``.
        mounts, scratch_mounts: more bwrap arguments, after ``/dev`` and after the scratch tmpfs.
        hidden: course folders to lay an empty folder over should an allowed tree hold them.
        env: the environment whose whitelisted part the sandbox keeps.
    """
    args = [*_system_args(), *_installed_args(installed, in_scratch=False), "--proc", "/proc", "--dev", "/dev",
            *mounts, "--perms", "01777", "--size", str(scratch_bytes), "--tmpfs", SCRATCH_DIR, *scratch_mounts,
            *_installed_args(installed, in_scratch=True)]
    for folder in _outermost(sorted({os.path.realpath(h) for h in hidden if h and os.path.isdir(h)})):
        if any(inside(folder, tree) for tree in [*SYSTEM_TREES, *installed]):  # a course in the installation, say
            args += ["--size", str(HIDDEN_TMPFS_BYTES), "--tmpfs", folder, "--remount-ro", folder]
    return [*args, "--remount-ro", "/", *_environment_args(env)]


def kernel_command(launch_dir: str, connection_file: str, ipc_dir: str, kernel_args: list[str],
                   boot_options: list[str], uid: int | None, limits: KernelLimits, hidden: list[str],
                   env: dict[str, str]) -> list[str]:
    """The bwrap command that runs ``python -I kernel_boot.py`` for one kernel; writes the kernel's ``passwd``,
    ``group`` and private connection file into ``launch_dir`` (whose ``files`` are shown at ``FILES_DIR``).

    Args:
        launch_dir: this kernel's folder on the host.
        connection_file: the connection file jupyter_client wrote (ipc transport, its sockets in ``ipc_dir``).
        ipc_dir: the folder of the kernel's ipc sockets, the only host folder it can write to (the grader connects
            there).
        kernel_args: the kernel's own arguments (``-f`` and nbclient's extra arguments); ``-f`` is rewritten to the
            connection file's place inside the sandbox.
        boot_options: ``kernel_boot.py``'s options besides ``--files``, ``--work`` and ``--uid``.
        uid: the uid the kernel becomes after binding its sockets (None: it keeps the grader's).
        limits: the kernel's limits (the sizes of its ``/tmp`` and ``/dev/shm``).
        hidden: course folders to hide should an allowed tree hold them.
        env: the kernel's environment, before the whitelist.
    """
    shown_uid = uid if uid is not None else os.getuid()
    Path(launch_dir, "passwd").write_text(f"root:x:0:0:root:/root:/usr/sbin/nologin\n"
                                          f"kernel:x:{shown_uid}:{shown_uid}:grading kernel:{SCRATCH_DIR}:"
                                          "/usr/sbin/nologin\n")
    Path(launch_dir, "group").write_text(f"root:x:0:\nkernel:x:{shown_uid}:\n")
    private_connection = os.path.join(launch_dir, "connection.json")
    shutil.copyfile(connection_file, private_connection)
    mounts = [*_parent_dirs([FILES_DIR, BOOT_PATH, CONNECTION_PATH]), "--ro-bind", "/sys", "/sys"]
    for name in ("passwd", "group"):
        mounts += ["--ro-bind", os.path.join(launch_dir, name), f"/etc/{name}"]
    for device in sorted(glob.glob("/dev/nvidia*")):  # what CUDA opens: GPUs, nvidiactl, nvidia-uvm, nvidia-caps/
        mounts += ["--dev-bind", device, device]
    mounts += ["--perms", "01777", "--size", str(limits.shm_bytes), "--tmpfs", "/dev/shm"]
    scratch_mounts = [*_parent_dirs([ipc_dir], SCRATCH_DIR), "--bind", ipc_dir, ipc_dir,
                      "--ro-bind", os.path.join(launch_dir, "files"), FILES_DIR, "--ro-bind", BOOT_SCRIPT, BOOT_PATH,
                      "--ro-bind", private_connection, CONNECTION_PATH]
    args = sandbox_args(installed_dirs(), limits.scratch_bytes, mounts, scratch_mounts, hidden, env)
    inner_args = list(kernel_args)
    inner_args[kernel_args.index("-f") + 1] = CONNECTION_PATH
    boot = [*boot_options, "--files", FILES_DIR, "--work", WORK_DIR, *([] if uid is None else ["--uid", str(uid)]),
            "--", *inner_args]
    return [*args, "--chdir", "/", "--", sys.executable, "-I", BOOT_PATH, *boot]
