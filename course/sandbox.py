"""Sandboxed grading kernels: every notebook nbgrader executes runs its kernel inside bubblewrap (``bwrap``).

``configure_sandbox(c)`` (called at the end of ``nbgrader_config.py``) points nbgrader's ``Execute`` at a kernelspec
whose argv is this file, and switches the Jupyter client to ZMQ ``ipc`` transport (the kernel has no network, so
its sockets are files in a private folder shared with the sandbox). Run as that kernelspec's argv, this file
(``python -I sandbox.py -f CONNECTION_FILE ...``) starts ``python -m ipykernel_launcher`` inside bwrap with:

- the whole filesystem read-only, with empty read-only folders over the course folder, the repository, the
  SQLite gradebook's folder, the Jupyter runtime folder (other kernels' keys), /root, /home, $HOME, /run,
  /var/lib/postgresql and the temp folders; the Python installation bound back read-only;
- the notebook's folder as a writable private copy without its notebooks (nbgrader wrote the hidden tests into
  the one being graded; what the kernel writes there is discarded, so nbgrader never follows a file the student
  replaced), a private size-capped /tmp as HOME and TMPDIR, /dev kept for GPUs;
- no network, its own PID and IPC namespaces, an environment reduced to ``ENV_KEEP``, uid/gid 65534 when grading
  runs as root (bwrap's user namespace otherwise), address-space and file-size limits.

``EFFICIENT_AI_SANDBOX``: ``auto`` (default; unsandboxed with one warning per nbgrader process when bwrap does not
work here), ``on`` (refuse to run without it) or ``off``. ``EFFICIENT_AI_SANDBOX_MEMORY_GB``: the kernel's
address-space cap (default 8; 0 for none; not applied when CUDA devices are present). Needs bubblewrap 0.7 or
newer, not setuid, run by root or with unprivileged user namespaces allowed.
"""
from __future__ import annotations

import atexit
import glob
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile

MODE_ENV = "EFFICIENT_AI_SANDBOX"
MEMORY_ENV = "EFFICIENT_AI_SANDBOX_MEMORY_GB"
HIDE_ENV = "EFFICIENT_AI_SANDBOX_HIDE"  # set by the kernelspec: course-specific folders the kernel must not see
KERNEL_NAME = "efficient-ai-sandbox"
PROCESS_DIR_PREFIX = "efficient-ai-kernels-"
DEFAULT_MEMORY_GB = 8.0
FILE_SIZE_CAP_BYTES = 1 << 30  # largest file the kernel may write
TMP_SIZE_BYTES = 1 << 30  # private /tmp (HOME, TMPDIR): RAM-backed, so capped
SHM_SIZE_BYTES = 256 << 20  # private /dev/shm
NOBODY_ID = 65534
SYSTEM_HIDDEN_DIRS = ("/tmp", "/var/tmp", "/root", "/home", "/run", "/var/lib/postgresql")
ENV_KEEP = (
    "PATH", "LANG", "LANGUAGE", "TZ", "EFFICIENT_AI_SCALE", "MPLBACKEND", "PYTHONUNBUFFERED", "PYTHONHASHSEED",
    "PYTHONDONTWRITEBYTECODE", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_HOME", "NVIDIA_VISIBLE_DEVICES",
    "LD_LIBRARY_PATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TRITON_INTERPRET",
    "PYTORCH_CUDA_ALLOC_CONF", "CC", "CXX",
)
ENV_KEEP_PREFIXES = ("LC_",)
# Run as root inside bwrap (no user namespace: one would map its uids to host root), drop to nobody, then exec.
_DROP_TO_NOBODY = (
    "import os, sys; os.setgroups([]); os.setresgid({0}, {0}, {0}); os.setresuid({0}, {0}, {0}); "
    "os.execv(sys.argv[1], sys.argv[1:])"
).format(NOBODY_ID)

_process_dir: str | None = None  # this nbgrader process's private folder (kernelspec, ipc sockets, kernels)
_warned = False


def sandbox_mode() -> str:
    """``auto``, ``on`` or ``off`` from EFFICIENT_AI_SANDBOX (anything else is read as ``on``: fail safe)."""
    mode = os.environ.get(MODE_ENV, "auto").strip().lower() or "auto"
    return mode if mode in ("auto", "off") else "on"


def _is_root() -> bool:
    return os.geteuid() == 0


def _namespace_args() -> list[str]:
    args = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--die-with-parent", "--new-session"]
    return args if _is_root() else ["--unshare-user", *args]


def unavailable_reason() -> str | None:
    """Why bwrap cannot sandbox kernels on this machine, or None when it can (runs it once, a few ms)."""
    if not sys.platform.startswith("linux"):
        return f"the sandbox needs Linux (this is {sys.platform})"
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    probe = [bwrap, *_namespace_args(), "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
             "--perms", "01777", "--size", "65536", "--tmpfs", "/tmp", "true"]  # --size: bubblewrap 0.7 or newer
    try:
        result = subprocess.run(probe, capture_output=True, text=True, timeout=30)
        version = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bwrap did not run: {exc}"
    if result.returncode != 0:
        hint = "" if _is_root() else "; unprivileged user namespaces may be disabled: grade as root, or allow them"
        return f"{version} fails here ({result.stderr.strip()[:300]}): it needs 0.7 or newer, not setuid{hint}"
    return None


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _sqlite_folder(db_url: str | None) -> str | None:
    if db_url and db_url.startswith("sqlite:///"):
        return os.path.dirname(os.path.abspath(db_url[len("sqlite:///"):]))
    return None


def configure_sandbox(c) -> None:
    """Make nbgrader's ``Execute`` run every kernel in the sandbox (nothing changes with EFFICIENT_AI_SANDBOX=off).

    Writes a kernelspec into a private folder of this process (on JUPYTER_PATH), selects it with
    ``c.Execute.kernel_name`` (the notebook's own kernelspec is ignored) and sets ``ipc`` transport on
    ``c.KernelManager``. Commands that run no kernel are unaffected.

    Args:
        c: the traitlets config object of ``nbgrader_config.py``.

    Raises:
        SystemExit: EFFICIENT_AI_SANDBOX=on and bwrap does not work here (traitlets would only log an Exception).
    """
    global _process_dir, _warned
    mode = sandbox_mode()
    if mode == "off":
        return
    reason = unavailable_reason()
    if reason is not None:
        if mode == "on":
            raise SystemExit(f"EFFICIENT_AI_SANDBOX=on, but grading kernels cannot be sandboxed: {reason}.")
        if not _warned:
            _warned = True
            print(
                f"WARNING: grading is NOT sandboxed: {reason}. Student code runs with this account's rights and can "
                "read source/, the gradebook and other submissions. Install bubblewrap to fix this; set "
                f"{MODE_ENV}=on to refuse grading without a sandbox, or {MODE_ENV}=off to silence this warning.",
                file=sys.stderr,
            )
        return
    c.Execute.kernel_name = KERNEL_NAME  # first: should anything below fail, no kernel starts (not an open one)
    course = c.get("CourseDirectory", {})
    hidden = [
        os.getcwd(), course.get("root"), _sqlite_folder(course.get("db_url")), os.environ.get("EFFICIENT_AI_REPO"),
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), tempfile.gettempdir(),
    ]
    if _process_dir is None:
        _remove_stale_process_dirs()
        # Short path under /tmp: ipc socket paths must stay under about 100 characters.
        _process_dir = tempfile.mkdtemp(prefix=f"{PROCESS_DIR_PREFIX}{os.getpid()}-", dir="/tmp")
        atexit.register(shutil.rmtree, _process_dir, True)
        os.makedirs(os.path.join(_process_dir, "ipc"))
        os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [_process_dir, os.environ.get("JUPYTER_PATH")]))
        if _memory_cap_bytes() and _cuda_devices():
            print("sandbox: CUDA devices present, so the kernel's address-space cap is not applied "
                  "(CUDA reserves far more virtual memory than it uses)", file=sys.stderr)
    spec_dir = os.path.join(_process_dir, "kernels", KERNEL_NAME)
    os.makedirs(spec_dir, exist_ok=True)
    spec = {
        "argv": [sys.executable, "-I", os.path.abspath(__file__), "-f", "{connection_file}"],
        "display_name": "Python 3 (sandboxed grading)",
        "language": "python",
        "interrupt_mode": "message",  # the kernel has its own session (bwrap --new-session): no SIGINT reaches it
        "env": {HIDE_ENV: os.pathsep.join(sorted({os.path.abspath(p) for p in hidden if p}))},
    }
    with open(os.path.join(spec_dir, "kernel.json"), "w") as handle:
        json.dump(spec, handle, indent=1)
    c.KernelManager.transport = "ipc"
    c.KernelManager.ip = os.path.join(_process_dir, "ipc", "kernel")


def _remove_stale_process_dirs() -> None:
    """Remove the private folders of nbgrader processes that were killed (at a time limit) before cleaning up."""
    for folder in glob.glob(f"/tmp/{PROCESS_DIR_PREFIX}*"):
        try:
            os.kill(int(folder[len(f"/tmp/{PROCESS_DIR_PREFIX}"):].split("-")[0]), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except (ValueError, PermissionError):
            pass


def _memory_cap_bytes() -> int:
    return int(float(os.environ.get(MEMORY_ENV, DEFAULT_MEMORY_GB)) * (1 << 30))


def _cuda_devices() -> list[str]:
    return glob.glob("/dev/nvidia[0-9]*")


def _set_limits() -> None:
    """Resource limits of this process, inherited by bwrap and the kernel."""
    memory_bytes = _memory_cap_bytes()
    if memory_bytes and not _cuda_devices():
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_CAP_BYTES, FILE_SIZE_CAP_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _python_dirs() -> list[str]:
    """The Python installation (venv and base interpreter), as named and with symlinks resolved."""
    dirs = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, os.path.dirname(sys.executable)}
    dirs |= {os.path.realpath(d) for d in dirs} | {os.path.dirname(os.path.realpath(sys.executable))}
    return sorted(dirs)


def _kernel_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ENV_KEEP or k.startswith(ENV_KEEP_PREFIXES)}
    # glibc reserves 64 MiB of address space per malloc arena (up to 8 per core): keep the cap meaningful.
    env.update(HOME="/tmp", TMPDIR="/tmp", USER="nobody", LOGNAME="nobody", MALLOC_ARENA_MAX="4",
               JPY_PARENT_PID="1")  # the sandbox's init: ipykernel then neither polls its parent nor prints a banner
    return env


def bwrap_command(kernel_argv: list[str], cwd: str, work_dir: str, writable: list[str], hidden: list[str]) -> list[str]:
    """The bwrap command line that runs ``kernel_argv`` sandboxed.

    Args:
        kernel_argv: the kernel's command line.
        cwd: the kernel's working folder as it sees it (the notebook's folder).
        work_dir: a private copy of ``cwd``, bound writable on ``cwd``.
        writable: private folders bound writable at their own paths (connection file, ipc sockets).
        hidden: folders replaced by empty read-only ones (system temp folders become a private writable /tmp).
    """
    args = [shutil.which("bwrap") or "bwrap", *_namespace_args(), "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev",
            "--perms", "01777", "--size", str(SHM_SIZE_BYTES), "--tmpfs", "/dev/shm", "--proc", "/proc"]
    hidden = sorted({os.path.realpath(h) for h in hidden if os.path.isdir(h)})
    outermost = [h for h in hidden if not any(h != o and _inside(h, o) for o in hidden)]
    for folder in outermost:
        if folder == "/tmp":
            args += ["--perms", "01777", "--size", str(TMP_SIZE_BYTES), "--tmpfs", folder]
        else:
            args += ["--size", str(1 << 20), "--tmpfs", folder]
    python_dirs = [d for d in _python_dirs() if any(_inside(d, h) for h in outermost)]
    # bwrap would create the folders leading to a mount point inside an empty folder with mode 0700.
    for folder in _folders_leading_to([*python_dirs, *writable, cwd], outermost):
        args += ["--perms", "0755", "--dir", folder]
    for folder in python_dirs:
        args += ["--ro-bind", folder, folder]
    for folder in hidden:  # hidden again inside the Python installation (a venv that holds a course, say)
        if any(_inside(folder, p) for p in python_dirs):
            args += ["--size", str(1 << 20), "--tmpfs", folder]
    for folder in writable:
        args += ["--bind", folder, folder]
    args += ["--bind", work_dir, cwd, "--chdir", cwd]
    for folder in outermost:
        if folder != "/tmp":
            args += ["--remount-ro", folder]
    args += ["--clearenv"]
    for key, value in sorted(_kernel_env().items()):
        args += ["--setenv", key, value]
    prefix = [sys.executable, "-I", "-c", _DROP_TO_NOBODY] if _is_root() else []
    return [*args, "--", *prefix, *kernel_argv]


def _folders_leading_to(paths: list[str], roots: list[str]) -> list[str]:
    """The folders strictly between one of ``roots`` and each of ``paths``, parents first."""
    folders = set()
    for path in paths:
        parent = os.path.dirname(path)
        while parent != os.path.dirname(parent):
            if any(_inside(parent, root) and parent != root for root in roots):
                folders.add(parent)
            parent = os.path.dirname(parent)
    return sorted(folders)


def _give_to_nobody(folder: str) -> None:
    """chown -R to uid/gid 65534, never following a symlink (the tree may hold a student's links)."""
    for parent, dirs, files in os.walk(folder):
        for name in [".", *dirs, *files]:
            os.chown(os.path.join(parent, name), NOBODY_ID, NOBODY_ID, follow_symlinks=False)


def launch(argv: list[str]) -> None:
    """Start ``python -m ipykernel_launcher ARGV`` sandboxed; replaces this process with bwrap.

    Args:
        argv: the kernelspec's arguments after this file: ``-f CONNECTION_FILE`` and any extra kernel arguments.

    Raises:
        SystemExit: the connection file does not ask for ipc transport (a sandboxed kernel has no TCP).
    """
    position = argv.index("-f") + 1
    connection_file = os.path.abspath(argv[position])
    with open(connection_file) as handle:
        info = json.load(handle)
    if info.get("transport") != "ipc" or not os.path.isabs(info.get("ip", "")):
        raise SystemExit("sandbox: the kernel needs ipc transport with an absolute ip (see configure_sandbox)")
    ipc_dir = os.path.dirname(info["ip"])
    kernel_dir = tempfile.mkdtemp(prefix="kernel-", dir=os.path.dirname(ipc_dir))
    cwd = os.getcwd()
    hidden = [*os.environ.get(HIDE_ENV, "").split(os.pathsep), *SYSTEM_HIDDEN_DIRS, os.path.expanduser("~"),
              tempfile.gettempdir(), os.path.dirname(connection_file)]
    work_dir = os.path.join(kernel_dir, "work")
    if any(_inside(os.path.realpath(h), cwd) for h in hidden if h):  # never copy a course, repository or home
        os.mkdir(work_dir)
        print(f"sandbox: the kernel's folder {cwd} holds private files, so the kernel starts in an empty copy",
              file=sys.stderr)
    else:  # without notebooks: the one being graded already holds the hidden tests
        shutil.copytree(cwd, work_dir, symlinks=True, ignore=shutil.ignore_patterns("*.ipynb"))
    argv[position] = os.path.join(kernel_dir, "connection.json")
    shutil.copyfile(connection_file, argv[position])
    if _is_root():
        _give_to_nobody(kernel_dir)
        os.chown(ipc_dir, NOBODY_ID, NOBODY_ID)
    command = bwrap_command([sys.executable, "-m", "ipykernel_launcher", *argv], cwd, work_dir,
                            [ipc_dir, kernel_dir], hidden)
    _set_limits()
    os.execv(command[0], command)


if __name__ == "__main__":
    launch(sys.argv[1:])
