"""Grading kernels: started isolated from student files, and sandboxed in bubblewrap (``bwrap``) where it works.

``configure_sandbox(c)`` (called at the end of ``nbgrader_config.py``) points nbgrader's ``Execute`` at a kernelspec
whose argv runs this file, ``python -I sandbox.py [--unsandboxed] -f CONNECTION_FILE``. Every kernel then starts
through ``course/kernel_boot.py`` with ``python -I`` in a private working folder holding a copy of the lab's
instructor files (the non-notebook files of the course's ``source/<lab>/``: ``utils.py``, ``assets/``), with only
those files added to ``sys.path``: no file a student submits can shadow a module, on any route to a grade.

Sandboxed (the default where bwrap works), the kernel sees an allow-list of the file system:

- read-only: ``/usr`` and the ``/bin``, ``/sbin``, ``/lib*`` links or folders, a few files of ``/etc`` (``ETC_KEEP``),
  the Python installation and the C and C++ compilers where they lie elsewhere (``_toolchain_dirs``; under ``/tmp``
  too, shown over the private ``/tmp`` below), ``/sys``; its
  own ``/proc`` (PID namespace) and a minimal ``/dev`` plus NVIDIA devices;
- ``/run/efficient-ai/``: the instructor files (on ``sys.path``), the boot script and the connection file, read-only;
- ``/tmp``: a private tmpfs of ``c.Sandbox.scratch_mb`` (HOME, TMPDIR, and the working folder
  ``/tmp/work``), a private 256 MiB ``/dev/shm``, and the folder of its ZMQ ``ipc`` sockets (it has no network);

nothing else: not the course, the gradebook, other submissions, home folders or another checkout anywhere on the
machine. Run as root, the kernel becomes a uid of its own (``KERNEL_UID_BASE`` + the launcher's PID) after binding its
sockets, with a cap on its processes and threads (RLIMIT_NPROC, counted per uid); where a cgroup hierarchy is
writable, each kernel also gets a cgroup of its own (``pids.max``; equal CPU weight, so a CPU or fork flood gets one
kernel's share, not the machine). Plus address-space and file-size caps, its own PID and IPC namespaces, no
network, an environment reduced to ``ENV_KEEP``.

``c.Sandbox`` (``course.settings.Sandbox``, docs/SETTINGS.md): ``mode`` ``auto`` (default; without a working bwrap,
kernels start isolated but unsandboxed, with one warning per nbgrader process), ``on`` (refuse to run without the
sandbox) or ``off`` (isolated start only); ``memory_gb``, ``scratch_mb``, ``max_processes``: the limits below. Needs
bubblewrap 0.7 or newer, not setuid, run by root or with unprivileged user namespaces allowed.
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

CPUS_ENV = "EFFICIENT_AI_CPUS"  # CPUs a worker's kernels run on ("0,1,2"): set per worker by course.grade
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

# Inside the sandbox.
RUN_DIR = "/run/efficient-ai"
FILES_DIR = RUN_DIR + "/files"
BOOT_PATH = RUN_DIR + "/kernel_boot.py"
CONNECTION_PATH = RUN_DIR + "/connection.json"
SCRATCH_DIR = "/tmp"
WORK_DIR = SCRATCH_DIR + "/work"
SYSTEM_TREES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_KEEP = (
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime",
    "/etc/timezone", "/etc/nsswitch.conf", "/etc/host.conf", "/etc/hosts", "/etc/os-release", "/etc/fonts",
    "/etc/mime.types",
)
ENV_KEEP = (
    "PATH", "LANG", "LANGUAGE", "TZ", "EFFICIENT_AI_SCALE", "MPLBACKEND", "PYTHONUNBUFFERED", "PYTHONHASHSEED",
    "PYTHONDONTWRITEBYTECODE", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_HOME", "NVIDIA_VISIBLE_DEVICES",
    "LD_LIBRARY_PATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TRITON_INTERPRET",
    "PYTORCH_CUDA_ALLOC_CONF", "CC", "CXX",
)
ENV_KEEP_PREFIXES = ("LC_",)

_process_dir: str | None = None  # this nbgrader process's private folder (kernelspec, ipc sockets, kernels)
_warned = False
# What the launcher applies: the nbgrader process's c.Sandbox settings (configure_sandbox), read back from its
# LAUNCH_FILE by the launcher (launch). The defaults are c.Sandbox's.
_limits = {"memory_bytes": 8 << 30, "scratch_bytes": 1024 << 20, "max_processes": 1024}


def _is_root() -> bool:
    return os.geteuid() == 0


def _namespace_args() -> list[str]:
    args = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session"]
    return args if _is_root() else ["--unshare-user", *args]


def _parent_dirs(destinations: list[str], under: str = "/") -> list[str]:
    """bwrap arguments making every folder between ``under`` and each destination with mode 0755, parents first.

    bwrap would make them with mode 0700, which the kernel's own uid could not pass through.
    """
    parents = set()
    for path in destinations:
        parent = os.path.dirname(path)
        while parent != os.path.dirname(parent) and parent != under and _inside(parent, under):
            parents.add(parent)
            parent = os.path.dirname(parent)
    args = []
    for folder in sorted(parents, key=lambda p: (p.count("/"), p)):
        args += ["--perms", "0755", "--dir", folder]
    return args


def _system_args() -> list[str]:
    """bwrap arguments that show the system's programs and libraries, read-only (links stay links)."""
    args = _parent_dirs([p for p in ETC_KEEP if os.path.exists(p)])
    for tree in SYSTEM_TREES:
        if os.path.islink(tree):
            args += ["--symlink", os.readlink(tree), tree]
        elif os.path.isdir(tree):
            args += ["--ro-bind", tree, tree]
    for path in ETC_KEEP:
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


_reasons: dict[tuple, str | None] = {}  # unavailable_reason's answers, by what they depend on


def unavailable_reason() -> str | None:
    """Why bwrap cannot sandbox kernels on this machine, or None when it can.

    Runs this Python in a sandbox that shows its installation as a kernel's does: a Python that
    cannot run there (a venv hidden by the sandbox's own folders, a library it cannot see) would kill every kernel,
    and every submission would score 0. Answered once per process for the same Python, bwrap, installation folders
    and library path."""
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
    overlapping = [d for d in installed if _inside(d, WORK_DIR) or _inside(WORK_DIR, d)]
    if overlapping:
        return (f"the Python installation or compiler at {overlapping[0]} overlaps the sandbox's working folder "
                f"{WORK_DIR}: install it elsewhere (a venv under /var/tmp or the home folder, say)")
    sandbox = [bwrap, *_namespace_args(), *_system_args(), *_installed_args(installed, in_scratch=False),
               "--proc", "/proc", "--dev", "/dev", "--perms", "01777", "--size", "65536", "--tmpfs", SCRATCH_DIR,
               *_installed_args(installed, in_scratch=True), "--remount-ro", "/", "--clearenv"]  # --size: 0.7+
    for key, value in sorted(kernel_env().items()):
        sandbox += ["--setenv", key, value]
    probe = [*sandbox, sys.executable, "-I", "-c", "pass"]  # this Python, shown as a kernel's is: not merely bwrap
    try:
        result = subprocess.run(probe, capture_output=True, text=True, timeout=30)
        version = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bwrap did not run: {exc}"
    if result.returncode != 0:
        if subprocess.run([*sandbox, "true"], capture_output=True, timeout=30).returncode == 0:  # only Python fails
            return (f"{sys.executable} does not run inside the sandbox ({result.stderr.strip()[:300]}); it shows "
                    f"read-only {', '.join(installed) or 'only /usr'} besides /usr")
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
    """Make nbgrader's ``Execute`` start every kernel isolated, and sandboxed unless ``c.Sandbox.mode`` (or
    EFFICIENT_AI_SANDBOX, ``course.settings``) says no.

    Writes a kernelspec and the launcher's settings (``LAUNCH_FILE``: the course folders to hide, the source folder,
    the limits of ``c.Sandbox``) into a private folder of this process (on JUPYTER_PATH) and selects the kernelspec
    with ``c.Execute.kernel_name`` (the notebook's own kernelspec is ignored); sandboxed, it also sets ``ipc``
    transport on ``c.KernelManager``. Commands that run no kernel are unaffected.

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
        print(
            f"WARNING: grading is NOT sandboxed: {reason}. Student code runs with this account's rights and can "
            "read source/, the gradebook and other submissions. Install bubblewrap to fix this; set "
            "c.Sandbox.mode = 'on' (or EFFICIENT_AI_SANDBOX=on) to refuse grading without a sandbox, or 'off' to "
            "silence this warning.",
            file=sys.stderr,
        )
    sandboxed = mode != "off" and reason is None
    c.Execute.kernel_name = KERNEL_NAME  # first: should anything below fail, no kernel starts (not an open one)
    process_dir = _ensure_process_dir(sandboxed)
    course = c.get("CourseDirectory", {})
    spec, launch = grading_kernel_spec(course.get("root") or os.getcwd(), course.get("source_directory"),
                                       course.get("db_url"), process_dir, sandboxed)
    with open(launch["file"], "w") as handle:
        json.dump({**launch, **_limits}, handle, indent=1)
    spec_dir = os.path.join(process_dir, "kernels", KERNEL_NAME)
    os.makedirs(spec_dir, exist_ok=True)
    with open(os.path.join(spec_dir, "kernel.json"), "w") as handle:
        json.dump(spec, handle, indent=1)
    if sandboxed:
        c.KernelManager.transport = "ipc"
        c.KernelManager.ip = os.path.join(process_dir, "ipc", "kernel")


def grading_kernel_spec(root: str, source_directory: str | None, db_url: str | None, runtime_dir: str,
                        sandboxed: bool) -> tuple[dict, dict]:
    """The kernelspec (``kernel.json``'s content) of a grading kernel for the course in ``root``, and what its
    launcher reads from ``LAUNCH_FILE`` in ``runtime_dir`` (``file``: that file's path) besides the limits.

    Args:
        root: the course folder (nbgrader's ``CourseDirectory.root``).
        source_directory: its source folder's name (default ``source``); the lab's instructor files come from it.
        db_url: the gradebook's URL (a SQLite gradebook's folder is hidden from the kernel).
        runtime_dir: where the launcher makes each kernel's private folder.
        sandboxed: start kernels in bwrap (else isolated only).
    """
    hidden = [
        os.getcwd(), root, _sqlite_folder(db_url), os.environ.get("EFFICIENT_AI_REPO"),
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), tempfile.gettempdir(),
    ]
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
        _remove_stale_process_dirs()
        # Short path under /tmp: ipc socket paths must stay under about 100 characters.
        _process_dir = tempfile.mkdtemp(prefix=f"{PROCESS_DIR_PREFIX}{os.getpid()}-", dir="/tmp")
        atexit.register(shutil.rmtree, _process_dir, True)
        os.makedirs(os.path.join(_process_dir, "ipc"))
        os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [_process_dir, os.environ.get("JUPYTER_PATH")]))
        if sandboxed and _limits["memory_bytes"] and _cuda_devices():
            print("sandbox: CUDA devices present, so the kernel's address-space cap is not applied "
                  "(CUDA reserves far more virtual memory than it uses)", file=sys.stderr)
    return _process_dir


def _remove_stale_process_dirs() -> None:
    """Remove the private folders of nbgrader processes that were killed (at a time limit) before cleaning up."""
    for folder in glob.glob(f"/tmp/{PROCESS_DIR_PREFIX}*"):
        try:
            os.kill(int(folder[len(f"/tmp/{PROCESS_DIR_PREFIX}"):].split("-")[0]), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except (ValueError, PermissionError):
            pass


def _cuda_devices() -> list[str]:
    return sorted(glob.glob("/dev/nvidia[0-9]*"))


def _nvidia_devices() -> list[str]:
    """Every NVIDIA device node (GPUs, nvidiactl, nvidia-uvm, nvidia-caps/): what CUDA opens."""
    return sorted(glob.glob("/dev/nvidia*"))


def _set_limits(kernel_uid: int | None) -> None:
    """Resource limits of this process, inherited by bwrap and the kernel; a lower CPU priority."""
    memory_bytes = _limits["memory_bytes"]
    if memory_bytes and not _cuda_devices():
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_CAP_BYTES, FILE_SIZE_CAP_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if kernel_uid is not None:  # counted per uid: only meaningful for a uid of the kernel's own (root is exempt)
        resource.setrlimit(resource.RLIMIT_NPROC, (_limits["max_processes"], _limits["max_processes"]))
    os.nice(KERNEL_NICE)


def _python_dirs() -> list[str]:
    """The Python installation (venv and base interpreter), as named and with symlinks resolved."""
    dirs = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, os.path.dirname(sys.executable)}
    dirs |= {os.path.realpath(d) for d in dirs} | {os.path.dirname(os.path.realpath(sys.executable))}
    return sorted(dirs)


COMPILER_ENV = ("CC", "CXX")  # the C and C++ compilers Triton and torch.compile call, where the grader names them
COMPILER_NAMES = ("cc", "gcc", "c++", "g++", "clang")  # what they look for on PATH otherwise


def _toolchain_dirs(environ=None) -> list[str]:
    """Where the C and C++ compilers a kernel may call are installed, outside ``SYSTEM_TREES``: Triton builds each
    kernel's launcher with one and torch.compile's CPU code needs one, so a compiler that ``CC`` or ``CXX`` names,
    or that PATH finds, is shown read-only in the sandbox (a cluster's ``module load gcc`` puts it in, say,
    ``/opt/gcc/12/bin``). A compiler in ``PREFIX/bin`` gives PREFIX (its cc1, headers and libraries lie there); a
    folder fewer than two levels deep, or one that holds the grader's HOME, is never shown."""
    environ = os.environ if environ is None else environ
    home = os.path.realpath(os.path.expanduser("~"))
    dirs = set()
    for name in [*(environ[k] for k in COMPILER_ENV if environ.get(k)), *COMPILER_NAMES]:
        found = shutil.which(name, path=environ.get("PATH", os.defpath))
        for binary in {found, os.path.realpath(found)} if found else ():
            folder = os.path.dirname(os.path.abspath(binary))
            prefix = os.path.dirname(folder) if os.path.basename(folder) == "bin" else folder
            if (prefix.count("/") >= 2 and not any(_inside(prefix, tree) for tree in SYSTEM_TREES)
                    and not _inside(home, prefix)):
                dirs.add(prefix)
    return sorted(dirs)


def _outermost(paths: list[str]) -> list[str]:
    return [p for p in paths if not any(p != o and _inside(p, o) for o in paths)]


def _installed_dirs() -> list[str]:
    """The folders outside ``SYSTEM_TREES`` a kernel runs from: the Python installation and the C compilers."""
    return _outermost(sorted({d for d in _python_dirs() if not any(_inside(d, t) for t in SYSTEM_TREES)}
                             | set(_toolchain_dirs())))


def _installed_args(installed: list[str], in_scratch: bool) -> list[str]:
    """bwrap arguments showing ``installed`` folders read-only: with ``in_scratch``, those inside ``SCRATCH_DIR``,
    which must follow the scratch tmpfs (mounted over them, it would hide them: a venv under /tmp); else the rest."""
    chosen = [d for d in installed if _inside(d, SCRATCH_DIR) == in_scratch]
    args = _parent_dirs(chosen, SCRATCH_DIR if in_scratch else "/")
    for folder in chosen:
        args += ["--ro-bind", folder, folder]
    return args


def kernel_env(environ=None) -> dict[str, str]:
    """The environment a sandboxed kernel gets, from ``environ`` (default: this process's): ``ENV_KEEP`` and the
    sandbox's own HOME, TMPDIR and user."""
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items() if k in ENV_KEEP or k.startswith(ENV_KEEP_PREFIXES)}
    # glibc reserves 64 MiB of address space per malloc arena (up to 8 per core): keep the cap meaningful.
    env.update(HOME=SCRATCH_DIR, TMPDIR=SCRATCH_DIR, USER="kernel", LOGNAME="kernel", MALLOC_ARENA_MAX="4",
               JPY_PARENT_PID="1")  # the sandbox's init: ipykernel then neither polls its parent nor prints a banner
    return env


def bwrap_command(boot_args: list[str], files: str, connection_file: str, ipc_dir: str, passwd_dir: str,
                  hidden: list[str]) -> list[str]:
    """The bwrap command line that runs ``python -I kernel_boot.py BOOT_ARGS`` sandboxed (the allow-list).

    Args:
        boot_args: arguments of ``course/kernel_boot.py`` (its options, ``--``, the kernel's arguments).
        files: the private copy of the instructor files, shown read-only at ``FILES_DIR``.
        connection_file: the private copy of the kernel's connection file, shown read-only at ``CONNECTION_PATH``.
        ipc_dir: the folder of the kernel's ipc sockets, writable at its own path (the grader connects there).
        passwd_dir: a folder holding the ``passwd`` and ``group`` files shown in ``/etc``.
        hidden: course folders laid over with an empty folder should an allowed tree hold them.
    """
    installed = _installed_dirs()
    args = [shutil.which("bwrap") or "bwrap", *_namespace_args(), *_system_args(),
            *_parent_dirs([FILES_DIR, BOOT_PATH, CONNECTION_PATH]), *_installed_args(installed, in_scratch=False)]
    for name in ("passwd", "group"):
        args += ["--ro-bind", os.path.join(passwd_dir, name), f"/etc/{name}"]
    args += ["--ro-bind", "/sys", "/sys", "--proc", "/proc", "--dev", "/dev"]
    for device in _nvidia_devices():
        args += ["--dev-bind", device, device]
    args += ["--perms", "01777", "--size", str(SHM_SIZE_BYTES), "--tmpfs", "/dev/shm",
             "--perms", "01777", "--size", str(_limits["scratch_bytes"]), "--tmpfs", SCRATCH_DIR,
             *_parent_dirs([ipc_dir], SCRATCH_DIR), "--bind", ipc_dir, ipc_dir,
             "--ro-bind", files, FILES_DIR, "--ro-bind", BOOT_SCRIPT, BOOT_PATH,
             "--ro-bind", connection_file, CONNECTION_PATH, *_installed_args(installed, in_scratch=True)]
    allowed = [*SYSTEM_TREES, *installed]
    for folder in _outermost(sorted({os.path.realpath(h) for h in hidden if h and os.path.isdir(h)})):
        if any(_inside(folder, tree) for tree in allowed):  # a course inside the Python installation, say
            args += ["--size", str(HIDDEN_TMPFS_BYTES), "--tmpfs", folder, "--remount-ro", folder]
    args += ["--remount-ro", "/", "--clearenv"]
    for key, value in sorted(kernel_env().items()):
        args += ["--setenv", key, value]
    return [*args, "--chdir", "/", "--", sys.executable, "-I", BOOT_PATH, *boot_args]


def _instructor_files(cwd: str, source_root: str | None) -> str | None:
    """The course's ``source/<lab>/`` for a kernel started in ``.../<lab>/`` (nbgrader's layout), if there is one."""
    if not source_root:
        return None
    folder = os.path.join(source_root, os.path.basename(os.path.abspath(cwd)))
    return folder if os.path.isdir(folder) else None


def prepare_files(cwd: str, source_root: str | None, hidden: list[str], dest: str) -> bool:
    """Fill ``dest`` with the files the kernel works with; whether they are the instructor's (then on sys.path).

    The instructor's files of the lab (never a notebook: nbgrader wrote hidden tests into the one being graded) when
    the course has them; else the kernel's folder without notebooks (nothing when it holds a course, the repository
    or a home folder). A student's symlinks are copied as links, never followed.
    """
    instructor = _instructor_files(cwd, source_root)
    ignore = shutil.ignore_patterns(*INSTRUCTOR_FILES_IGNORE)
    if instructor is not None:
        shutil.copytree(instructor, dest, ignore=ignore)
        _make_readable(dest)  # the kernel reads them as another uid
        return True
    if any(_inside(os.path.realpath(h), cwd) for h in hidden if h):
        os.mkdir(dest)
        print(f"sandbox: the kernel's folder {cwd} holds private files, so the kernel starts in an empty copy",
              file=sys.stderr)
    else:
        shutil.copytree(cwd, dest, symlinks=True, ignore=shutil.ignore_patterns("*.ipynb"))
    return False


def _make_readable(folder: str) -> None:
    """chmod a+rX over a tree of the instructor's files (no symlinks in it: copytree followed them)."""
    for parent, dirs, files in os.walk(folder):
        os.chmod(parent, os.stat(parent).st_mode | 0o555)
        for name in files:
            path = os.path.join(parent, name)
            os.chmod(path, os.stat(path).st_mode | 0o444)


def _write_passwd(folder: str, uid: int) -> None:
    with open(os.path.join(folder, "passwd"), "w") as handle:
        handle.write(f"root:x:0:0:root:/root:/usr/sbin/nologin\nkernel:x:{uid}:{uid}:grading kernel:"
                     f"{SCRATCH_DIR}:/usr/sbin/nologin\n")
    with open(os.path.join(folder, "group"), "w") as handle:
        handle.write(f"root:x:0:\nkernel:x:{uid}:\n")


def parse_cpus(text: str) -> set[int]:
    """CPU numbers from ``"0,1,5"`` (empty: no restriction)."""
    return {int(part) for part in text.split(",") if part.strip().isdigit()}


def launch(argv: list[str]) -> None:
    """Start the kernel: replaces this process with bwrap (sandboxed) or with the boot script (``--unsandboxed``).

    Args:
        argv: the kernelspec's arguments after this file: ``[--settings LAUNCH_FILE] [--unsandboxed] -f
            CONNECTION_FILE`` and any extra kernel arguments. ``LAUNCH_FILE`` (written by ``configure_sandbox``)
            names the course folders to hide, the course's source folder, where kernels' folders go, and the limits.
    """
    settings = {}
    if "--settings" in argv:
        at = argv.index("--settings")
        with open(argv[at + 1]) as handle:
            settings = json.load(handle)
        argv = argv[:at] + argv[at + 2:]
    _limits.update({key: settings[key] for key in _limits if key in settings})
    sandboxed = "--unsandboxed" not in argv
    argv = [a for a in argv if a != "--unsandboxed"]
    cpus = parse_cpus(os.environ.get(CPUS_ENV, ""))
    if cpus and hasattr(os, "sched_setaffinity"):  # the kernel runs on its worker's CPUs
        os.sched_setaffinity(0, cpus)
    connection_file = os.path.abspath(argv[argv.index("-f") + 1])
    hidden = [*settings.get("hidden", []), os.path.expanduser("~"), tempfile.gettempdir(),
              os.path.dirname(connection_file)]
    kernel_dir = tempfile.mkdtemp(prefix="kernel-", dir=settings.get("runtime") or None)
    files = os.path.join(kernel_dir, "files")
    boot_options = ["--on-path"] if prepare_files(os.getcwd(), settings.get("source"), hidden, files) else []
    if sandboxed:
        _exec_sandboxed(argv, connection_file, kernel_dir, boot_options, hidden)
    command = [sys.executable, "-I", BOOT_SCRIPT, *boot_options, "--files", files, "--work",
               os.path.join(kernel_dir, "work"), "--", *argv]
    os.execv(command[0], command)


def _exec_sandboxed(argv: list[str], connection_file: str, kernel_dir: str, boot_options: list[str],
                    hidden: list[str]) -> None:
    """Replace this process with the kernel in bwrap, in cgroups of its own, with its limits.

    Raises:
        SystemExit: the connection file does not ask for ipc transport (the kernel has no TCP).
    """
    command = _sandbox_command(argv, connection_file, kernel_dir, boot_options, hidden)
    join_kernel_cgroup(_limits["max_processes"])
    _set_limits(_kernel_uid())
    os.execv(command[0], command)


def _kernel_uid() -> int | None:
    """The uid the kernel of this launcher becomes: one of its own when run as root, else None (it keeps ours)."""
    return KERNEL_UID_BASE + os.getpid() if _is_root() else None


def _sandbox_command(argv: list[str], connection_file: str, kernel_dir: str, boot_options: list[str],
                     hidden: list[str]) -> list[str]:
    """The bwrap command of this launcher's kernel; writes the kernel's passwd and private connection file into
    ``kernel_dir`` (whose ``files`` folder holds the instructor files, shown at ``FILES_DIR``).

    Raises:
        SystemExit: the connection file does not ask for ipc transport (the kernel has no TCP).
    """
    with open(connection_file) as handle:
        info = json.load(handle)
    if info.get("transport") != "ipc" or not os.path.isabs(info.get("ip", "")):
        raise SystemExit("sandbox: the kernel needs ipc transport with an absolute ip (see configure_sandbox)")
    kernel_uid = _kernel_uid()
    _write_passwd(kernel_dir, os.getuid() if kernel_uid is None else kernel_uid)
    private_connection = os.path.join(kernel_dir, "connection.json")
    shutil.copyfile(connection_file, private_connection)
    kernel_args = list(argv)
    kernel_args[argv.index("-f") + 1] = CONNECTION_PATH
    boot = [*boot_options, "--files", FILES_DIR, "--work", WORK_DIR,
            *(["--uid", str(kernel_uid)] if kernel_uid is not None else []), "--", *kernel_args]
    return bwrap_command(boot, os.path.join(kernel_dir, "files"), private_connection, os.path.dirname(info["ip"]),
                         kernel_dir, hidden)


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
            names = set(controllers.split(",")) if controllers else set()
            if (fstype == "cgroup2" and not controllers) or (fstype == "cgroup" and names & {"cpu", "pids"} & options):
                relative = os.path.relpath(path, root) if _inside(path, root) else None
                if relative is not None:
                    bases.append((os.path.normpath(os.path.join(point, relative)), "v2" if fstype == "cgroup2" else "v1"))
    return bases


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def _kernel_cgroup(base: str, version: str, max_processes: int) -> str | None:
    """A fresh cgroup for this kernel under ``base``/efficient-ai, with its limits; None where that is not allowed."""
    parent = os.path.join(base, CGROUP_PARENT)
    try:
        if version == "v2":
            available = set(open(os.path.join(base, "cgroup.controllers")).read().split())
            if not {"cpu", "pids"} <= available:
                return None
            _write(os.path.join(base, "cgroup.subtree_control"), "+cpu +pids")
        os.makedirs(parent, exist_ok=True)
        if version == "v2":
            _write(os.path.join(parent, "cgroup.subtree_control"), "+cpu +pids")
        for stale in glob.glob(os.path.join(parent, CGROUP_PREFIX + "*")):
            try:
                os.rmdir(stale)  # only an empty cgroup goes: its kernel is gone
            except OSError:
                pass
        group = os.path.join(parent, f"{CGROUP_PREFIX}{os.getpid()}")
        os.makedirs(group, exist_ok=True)
        if os.path.exists(os.path.join(group, "pids.max")):
            _write(os.path.join(group, "pids.max"), str(max_processes))
        return group
    except OSError:
        return None


def join_kernel_cgroup(max_processes: int) -> list[str]:
    """Move this process (soon the kernel) into cgroups of its own: a pids cap and an equal CPU share.

    Best effort: where no cgroup hierarchy is writable (a container without cgroup delegation), nothing changes
    and RLIMIT_NPROC alone caps processes. Returns the cgroups joined.
    """
    joined = []
    for base, version in _cgroup_bases():
        group = _kernel_cgroup(base, version, max_processes)
        if group is None:
            continue
        try:
            _write(os.path.join(group, "cgroup.procs"), str(os.getpid()))
            joined.append(group)
        except OSError:
            pass
    return joined


if __name__ == "__main__":
    launch(sys.argv[1:])
