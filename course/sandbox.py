"""Grading kernels: started isolated from student files, and sandboxed in bubblewrap (``bwrap``) where it works.

``configure_sandbox(c)`` (end of ``nbgrader_config.py``) selects a kernelspec that runs ``launch``: it copies the lab's
instructor files into a private folder and starts ``course/kernel_boot.py`` with only that copy on ``sys.path``;
sandboxed, inside the allow-list of ``_bwrap_args``, with resource caps and a cgroup and uid of its own. What each
defence stops: docs/SECURITY.md ("isolated start", "sandbox"); ``c.Sandbox``'s options: docs/SETTINGS.md. Needs
bubblewrap 0.7 or newer, not setuid, run by root or with unprivileged user namespaces.
"""
from __future__ import annotations

import atexit
import contextlib
import glob
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

KERNEL_NAME = "efficient-ai-sandbox"
PROCESS_DIR_PREFIX = "efficient-ai-kernels-"
BOOT_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_boot.py")
LAUNCHER_SCRIPT = os.path.abspath(__file__)  # the kernelspec's argv runs it
LAUNCH_FILE = "launch.json"  # in the nbgrader process's private folder: what its kernels' launcher needs
FILE_SIZE_CAP_BYTES = 1 << 30  # largest file the kernel may write
SHM_SIZE_BYTES = 256 << 20  # private /dev/shm
HIDDEN_TMPFS_BYTES = 1 << 20  # the empty folder laid over a course folder inside an allowed tree
KERNEL_UID_BASE = 2_000_000_000  # + the launcher's PID (at most 2**22): a uid no one else uses, for RLIMIT_NPROC
KERNEL_NICE = 5  # kernels yield to the grader's own processes (nbgrader, the ZMQ client)
CGROUP_PARENT = "efficient-ai"
CGROUP_PREFIX = "kernel-"
INSTRUCTOR_FILES_IGNORE = ("*.ipynb", ".ipynb_checkpoints", "__pycache__", "*.pyc")
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

_process_dir: str | None = None  # this nbgrader process's private folder (kernelspec, ipc sockets, kernels)
_warned = False
_reasons: dict[tuple, str | None] = {}  # unavailable_reason's answers, by what they depend on
# c.Sandbox's limits: set by configure_sandbox, read back from LAUNCH_FILE by launch. The defaults are c.Sandbox's.
_limits = {"memory_bytes": 8 << 30, "scratch_bytes": 1024 << 20, "max_processes": 1024}
kernel_cpus: list[int] = []  # CPUs this nbgrader process's kernels run on (empty: all): course.nbgrader_child sets it


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _outermost(paths: list[str]) -> list[str]:
    return [p for p in paths if not any(p != o and _inside(p, o) for o in paths)]


# The nbgrader process: choose the grading kernelspec.
def configure_sandbox(c) -> None:
    """Make nbgrader's ``Execute`` start every kernel through ``launch``, whatever kernelspec the notebook names:
    sandboxed, over ``ipc`` transport, unless ``c.Sandbox.mode`` (or EFFICIENT_AI_SANDBOX) says no.

    Args:
        c: the traitlets config object of ``nbgrader_config.py``.

    Raises:
        SystemExit: the mode is ``on`` and bwrap does not work here (traitlets would only log an Exception).
    """
    global _warned
    from .settings import Sandbox, apply_environment

    apply_environment(c, ("Sandbox",))
    options = Sandbox(config=c)
    _limits.update(memory_bytes=int(options.memory_gb * (1 << 30)), scratch_bytes=options.scratch_mb << 20,
                   max_processes=options.max_processes)
    mode = options.mode
    reason = None if mode == "off" else unavailable_reason()
    if reason is not None and mode == "on":
        raise SystemExit(f"the sandbox mode is 'on' (c.Sandbox.mode, or EFFICIENT_AI_SANDBOX=on), but grading kernels "
                         f"cannot be sandboxed: {reason}.")
    if reason is not None and not _warned:
        _warned = True
        print(f"WARNING: grading is NOT sandboxed: {reason}. Student code runs with this account's rights and can "
              "read source/, the gradebook and other submissions. Install bubblewrap to fix this; set "
              "c.Sandbox.mode = 'on' (or EFFICIENT_AI_SANDBOX=on) to refuse grading without a sandbox, or 'off' to "
              "silence this warning.", file=sys.stderr)
    sandboxed = mode != "off" and reason is None
    c.Execute.kernel_name = KERNEL_NAME  # first: should anything below fail, no kernel starts (not an open one)
    process_dir = _ensure_process_dir(sandboxed)
    course = c.get("CourseDirectory", {})
    spec, launch = grading_kernel_spec(course.get("root") or os.getcwd(), course.get("source_directory"),
                                       course.get("db_url"), process_dir, sandboxed)
    Path(launch["file"]).write_text(json.dumps({**launch, **_limits, "cpus": kernel_cpus}, indent=1))
    spec_dir = Path(process_dir, "kernels", KERNEL_NAME)
    spec_dir.mkdir(parents=True, exist_ok=True)
    (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1))
    if sandboxed:
        c.KernelManager.transport = "ipc"
        c.KernelManager.ip = os.path.join(process_dir, "ipc", "kernel")


def grading_kernel_spec(root: str, source_directory: str | None, db_url: str | None, runtime_dir: str,
                        sandboxed: bool) -> tuple[dict, dict]:
    """``kernel.json`` of a grading kernel for the course in ``root``, and what ``LAUNCH_FILE`` holds besides the
    limits: its path, the folders to hide (a SQLite gradebook's too), the source folder and ``runtime_dir``."""
    sqlite = db_url[len("sqlite:///"):] if db_url and db_url.startswith("sqlite:///") else None
    hidden = [os.getcwd(), root, sqlite and os.path.dirname(os.path.abspath(sqlite)),
              os.path.dirname(os.path.dirname(LAUNCHER_SCRIPT)), tempfile.gettempdir()]
    launch = {
        "file": os.path.join(runtime_dir, LAUNCH_FILE),
        "hidden": sorted({os.path.abspath(p) for p in hidden if p}),
        "source": os.path.join(os.path.abspath(root), source_directory or "source"),
        "runtime": runtime_dir,
    }
    spec = {
        "argv": [sys.executable, "-I", LAUNCHER_SCRIPT, "--settings", launch["file"],
                 *([] if sandboxed else ["--unsandboxed"]), "-f", "{connection_file}"],
        "display_name": "Python 3 (isolated grading)" + (", sandboxed" if sandboxed else ""),
        "language": "python",
    }
    if sandboxed:
        spec["interrupt_mode"] = "message"  # the kernel has its own session (bwrap --new-session): no SIGINT
    return spec, launch


def _ensure_process_dir(sandboxed: bool) -> str:
    """This nbgrader process's private folder (made once, removed at exit), put first on JUPYTER_PATH."""
    global _process_dir
    if _process_dir is None:
        for folder in glob.glob(f"/tmp/{PROCESS_DIR_PREFIX}*"):  # left by nbgrader processes killed at a time limit
            try:
                os.kill(int(folder[len(f"/tmp/{PROCESS_DIR_PREFIX}"):].split("-")[0]), 0)
            except ProcessLookupError:
                shutil.rmtree(folder, ignore_errors=True)
            except (ValueError, PermissionError):
                pass
        # Short path under /tmp: ipc socket paths must stay under about 100 characters.
        _process_dir = tempfile.mkdtemp(prefix=f"{PROCESS_DIR_PREFIX}{os.getpid()}-", dir="/tmp")
        atexit.register(shutil.rmtree, _process_dir, True)
        os.makedirs(os.path.join(_process_dir, "ipc"))
        os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [_process_dir, os.environ.get("JUPYTER_PATH")]))
        if sandboxed and _limits["memory_bytes"] and glob.glob("/dev/nvidia[0-9]*"):
            print("sandbox: CUDA devices present, so the kernel's address-space cap is not applied "
                  "(CUDA reserves far more virtual memory than it uses)", file=sys.stderr)
    return _process_dir


def unavailable_reason() -> str | None:
    """Why bwrap cannot sandbox kernels here, or None when it can (cached per Python, bwrap, uid, installation and
    library path). It runs this Python in a kernel's sandbox: one that cannot run there would score every kernel 0."""
    if not sys.platform.startswith("linux"):
        return f"the sandbox needs Linux (this is {sys.platform})"
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    installed = _installed_dirs()
    key = (sys.executable, bwrap, os.geteuid(), tuple(installed), os.environ.get("LD_LIBRARY_PATH"))
    if key not in _reasons:
        _reasons[key] = _probe(bwrap, installed)
    return _reasons[key]


def _probe(bwrap: str, installed: list[str]) -> str | None:
    """``unavailable_reason``'s check of bwrap and of this Python inside it."""
    if overlapping := [d for d in installed if _inside(d, WORK_DIR) or _inside(WORK_DIR, d)]:
        return (f"the Python installation or compiler at {overlapping[0]} overlaps the sandbox's working folder "
                f"{WORK_DIR}: install it elsewhere (a venv under /var/tmp or the home folder, say)")
    sandbox = _bwrap_args(installed, 65536, [], [], [])  # --size needs bwrap 0.7+
    try:
        result = subprocess.run([*sandbox, sys.executable, "-I", "-c", "pass"], capture_output=True, text=True,
                                timeout=30)
        version = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bwrap did not run: {exc}"
    if result.returncode != 0:
        if subprocess.run([*sandbox, "true"], capture_output=True, timeout=30).returncode == 0:  # only Python fails
            return (f"{sys.executable} does not run inside the sandbox ({result.stderr.strip()[:300]}); it shows "
                    f"read-only {', '.join(installed) or 'only /usr'} besides /usr")
        hint = "; unprivileged user namespaces may be disabled: grade as root, or allow them" if os.geteuid() else ""
        return f"{version} fails here ({result.stderr.strip()[:300]}): it needs 0.7 or newer, not setuid{hint}"
    return None


# The bwrap command line: what the kernel (and the probe) can see.
def _installed_dirs() -> list[str]:
    """The folders outside ``SYSTEM_TREES`` a kernel runs from: the Python installation (venv and base, as named and
    resolved) and the C compilers' (``_toolchain_dirs``)."""
    python = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, os.path.dirname(sys.executable)}
    python |= {os.path.realpath(d) for d in python} | {os.path.dirname(os.path.realpath(sys.executable))}
    outside = {d for d in python if not any(_inside(d, tree) for tree in SYSTEM_TREES)}
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
            if (prefix.count("/") >= 2 and not any(_inside(prefix, tree) for tree in SYSTEM_TREES)
                    and not _inside(home, prefix)):
                dirs.add(prefix)
    return sorted(dirs)


def _parent_dirs(destinations: list[str], under: str = "/") -> list[str]:
    """bwrap arguments making every folder between ``under`` and each destination, parents first, mode 0755 (bwrap's
    0700 would stop the kernel's own uid)."""
    parents = set()
    for path in destinations:
        parent = os.path.dirname(path)
        while parent != os.path.dirname(parent) and parent != under and _inside(parent, under):
            parents.add(parent)
            parent = os.path.dirname(parent)
    ordered = sorted(parents, key=lambda p: (p.count("/"), p))
    return [arg for folder in ordered for arg in ("--perms", "0755", "--dir", folder)]


def _installed_args(installed: list[str], in_scratch: bool) -> list[str]:
    """bwrap arguments showing the ``installed`` folders inside ``SCRATCH_DIR`` (``in_scratch``: they must follow
    the scratch tmpfs, which would hide them) or the others read-only."""
    chosen = [d for d in installed if _inside(d, SCRATCH_DIR) == in_scratch]
    args = _parent_dirs(chosen, SCRATCH_DIR if in_scratch else "/")
    for folder in chosen:
        args += ["--ro-bind", folder, folder]
    return args


def _bwrap_args(installed: list[str], scratch_bytes: int, mounts: list[str], scratch_mounts: list[str],
                hidden: list[str]) -> list[str]:
    """bwrap, its namespaces and the allow-list the kernel and the probe share, up to the command.

    Args:
        installed: ``_installed_dirs()``, shown read-only.
        scratch_bytes: size of the private tmpfs at ``SCRATCH_DIR``.
        mounts, scratch_mounts: more bwrap arguments, after ``/dev`` and after the scratch tmpfs.
        hidden: course folders to lay an empty folder over should an allowed tree hold them.
    """
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
    args += [*_installed_args(installed, in_scratch=False), "--proc", "/proc", "--dev", "/dev", *mounts,
             "--perms", "01777", "--size", str(scratch_bytes), "--tmpfs", SCRATCH_DIR, *scratch_mounts,
             *_installed_args(installed, in_scratch=True)]
    for folder in _outermost(sorted({os.path.realpath(h) for h in hidden if h and os.path.isdir(h)})):
        if any(_inside(folder, tree) for tree in [*SYSTEM_TREES, *installed]):  # a course in the installation, say
            args += ["--size", str(HIDDEN_TMPFS_BYTES), "--tmpfs", folder, "--remount-ro", folder]
    env = {k: v for k, v in os.environ.items() if k in ENV_KEEP or k.startswith(ENV_KEEP_PREFIXES)}
    # glibc reserves 64 MiB of address space per malloc arena (up to 8 per core): keep the cap meaningful.
    env.update(HOME=SCRATCH_DIR, TMPDIR=SCRATCH_DIR, USER="kernel", LOGNAME="kernel", MALLOC_ARENA_MAX="4",
               JPY_PARENT_PID="1")  # the sandbox's init: ipykernel then neither polls its parent nor prints a banner
    args += ["--remount-ro", "/", "--clearenv"]
    for key, value in sorted(env.items()):
        args += ["--setenv", key, value]
    return args


# The launcher: the kernelspec's argv, one per kernel.
def launch(argv: list[str]) -> None:
    """Replace this process with the kernel, in bwrap or (``--unsandboxed``) started by the boot script alone.

    Args:
        argv: ``[--settings LAUNCH_FILE] [--unsandboxed] -f CONNECTION_FILE`` and any extra kernel arguments.
    """
    settings = {}
    if "--settings" in argv:
        at = argv.index("--settings")
        settings = json.loads(Path(argv[at + 1]).read_text())
        argv = argv[:at] + argv[at + 2:]
    _limits.update({key: settings[key] for key in _limits if key in settings})
    sandboxed = "--unsandboxed" not in argv
    argv = [a for a in argv if a != "--unsandboxed"]
    if settings.get("cpus") and hasattr(os, "sched_setaffinity"):  # the kernel runs on its worker's CPUs
        os.sched_setaffinity(0, settings["cpus"])
    connection_file = os.path.abspath(argv[argv.index("-f") + 1])
    hidden = [*settings.get("hidden", []), os.path.expanduser("~"), tempfile.gettempdir(),
              os.path.dirname(connection_file)]
    kernel_dir = tempfile.mkdtemp(prefix="kernel-", dir=settings.get("runtime") or None)
    files = os.path.join(kernel_dir, "files")
    boot_options = ["--on-path"] if prepare_files(os.getcwd(), settings.get("source"), hidden, files) else []
    if sandboxed:
        command = _sandbox_command(argv, connection_file, kernel_dir, boot_options, hidden)
        join_kernel_cgroup(_limits["max_processes"])
        _set_limits()
    else:
        command = [sys.executable, "-I", BOOT_SCRIPT, *boot_options, "--files", files, "--work",
                   os.path.join(kernel_dir, "work"), "--", *argv]
    os.execv(command[0], command)


def prepare_files(cwd: str, source_root: str | None, hidden: list[str], dest: str) -> bool:
    """Fill ``dest`` with the kernel's files: ``source_root/<lab>/`` for a kernel started in ``.../<lab>/`` when the
    course has it (then returns True: they go on sys.path), else a copy of ``cwd`` (empty when it holds a ``hidden``
    folder; symlinks stay links). Never a notebook: the one being graded holds the hidden tests."""
    instructor = os.path.join(source_root, os.path.basename(os.path.abspath(cwd))) if source_root else ""
    if os.path.isdir(instructor):
        shutil.copytree(instructor, dest, ignore=shutil.ignore_patterns(*INSTRUCTOR_FILES_IGNORE))
        for parent, _, names in os.walk(dest):  # a+rX: the kernel reads them as another uid (no links: copied)
            os.chmod(parent, os.stat(parent).st_mode | 0o555)
            for name in names:
                os.chmod(os.path.join(parent, name), os.stat(os.path.join(parent, name)).st_mode | 0o444)
        return True
    if any(_inside(os.path.realpath(h), cwd) for h in hidden if h):
        os.mkdir(dest)
        print(f"sandbox: the kernel's folder {cwd} holds private files, so the kernel starts in an empty copy",
              file=sys.stderr)
    else:
        shutil.copytree(cwd, dest, symlinks=True, ignore=shutil.ignore_patterns("*.ipynb"))
    return False


def _sandbox_command(argv: list[str], connection_file: str, kernel_dir: str, boot_options: list[str],
                     hidden: list[str]) -> list[str]:
    """The bwrap command that runs ``python -I kernel_boot.py``; writes the kernel's ``passwd``, ``group`` and
    private connection file into ``kernel_dir`` (whose ``files`` are shown at ``FILES_DIR``).

    Raises:
        SystemExit: the connection file does not ask for ipc transport (the kernel has no TCP).
    """
    info = json.loads(Path(connection_file).read_text())
    if info.get("transport") != "ipc" or not os.path.isabs(info.get("ip", "")):
        raise SystemExit("sandbox: the kernel needs ipc transport with an absolute ip (see configure_sandbox)")
    uid = KERNEL_UID_BASE + os.getpid() if os.geteuid() == 0 else os.getuid()
    Path(kernel_dir, "passwd").write_text(f"root:x:0:0:root:/root:/usr/sbin/nologin\n"
                                          f"kernel:x:{uid}:{uid}:grading kernel:{SCRATCH_DIR}:/usr/sbin/nologin\n")
    Path(kernel_dir, "group").write_text(f"root:x:0:\nkernel:x:{uid}:\n")
    private_connection = os.path.join(kernel_dir, "connection.json")
    shutil.copyfile(connection_file, private_connection)
    mounts = [*_parent_dirs([FILES_DIR, BOOT_PATH, CONNECTION_PATH]), "--ro-bind", "/sys", "/sys"]
    for name in ("passwd", "group"):
        mounts += ["--ro-bind", os.path.join(kernel_dir, name), f"/etc/{name}"]
    for device in sorted(glob.glob("/dev/nvidia*")):  # what CUDA opens: GPUs, nvidiactl, nvidia-uvm, nvidia-caps/
        mounts += ["--dev-bind", device, device]
    mounts += ["--perms", "01777", "--size", str(SHM_SIZE_BYTES), "--tmpfs", "/dev/shm"]
    ipc_dir = os.path.dirname(info["ip"])  # writable: the grader connects there
    scratch_mounts = [*_parent_dirs([ipc_dir], SCRATCH_DIR), "--bind", ipc_dir, ipc_dir,
                      "--ro-bind", os.path.join(kernel_dir, "files"), FILES_DIR, "--ro-bind", BOOT_SCRIPT, BOOT_PATH,
                      "--ro-bind", private_connection, CONNECTION_PATH]
    args = _bwrap_args(_installed_dirs(), _limits["scratch_bytes"], mounts, scratch_mounts, hidden)
    kernel_args = list(argv)
    kernel_args[argv.index("-f") + 1] = CONNECTION_PATH
    boot = [*boot_options, "--files", FILES_DIR, "--work", WORK_DIR,
            *(["--uid", str(uid)] if os.geteuid() == 0 else []), "--", *kernel_args]
    return [*args, "--chdir", "/", "--", sys.executable, "-I", BOOT_PATH, *boot]


def _set_limits() -> None:
    """Resource limits of this process, inherited by bwrap and the kernel; a lower CPU priority."""
    memory_bytes = _limits["memory_bytes"]
    if memory_bytes and not glob.glob("/dev/nvidia[0-9]*"):  # CUDA reserves far more address space than it uses
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_CAP_BYTES, FILE_SIZE_CAP_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if os.geteuid() == 0:  # counted per uid: meaningful only for the kernel's own uid (root is exempt)
        resource.setrlimit(resource.RLIMIT_NPROC, (_limits["max_processes"], _limits["max_processes"]))
    os.nice(KERNEL_NICE)


# cgroups: one per kernel, where a hierarchy with the cpu and pids controllers is writable (cgroup v2, or v1).
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


if __name__ == "__main__":
    launch(sys.argv[1:])
