"""Start a grading kernel that no file beside it can shadow (run by ``course/sandbox.py``; standard library only).

``python -I kernel_boot.py --files DIR --work DIR [--on-path] [--uid N] -- KERNEL_ARGUMENTS``:

1. copies ``--files`` (the lab's instructor files: ``utils.py``, ``assets/``; never a notebook) into ``--work``, the
   kernel's writable working folder;
2. with ``--on-path``, puts ``--files`` first on ``sys.path``, so ``import utils`` finds the instructor's copy. The
   working folder, the folder this file is in and ``PYTHONPATH`` are never on ``sys.path`` (``python -I``, IPython's
   ``ignore_cwd``): a student's ``torch.py``, ``sitecustomize.py`` or ``ipykernel_launcher.py`` is never imported;
3. creates the kernel, which binds its sockets; then, with ``--uid`` (the sandbox started it as root), gives the
   working folder and HOME to uid/gid N and becomes that user, with no supplementary groups (the socket folder stays
   root's: the kernel cannot write there);
4. changes into the working folder; with ``--preload a,b``, imports those modules (a pre-started kernel does the
   imports of the lab's setup cells before its submission needs it: ``course/kernel_pool.py``; a module that fails
   to import is left for the cell that imports it); then freezes what start-up made (``freeze_heap``) and runs the
   kernel.

With ``--zygote`` it starts no kernel: it makes the imports (``--on-path``, ``--preload``) once, freezes them, and
then forks a kernel for every request it reads on stdin (one JSON line, ``{"args": [...], "log": PATH, "env": {...},
"cpus": [...]}``: this script's arguments for that kernel, the file its output goes to, its environment and CPUs),
answering ``{"pid": N}`` on stdout. Each child starts its own session, takes that environment, CPUs and thread count,
and runs steps 1-4 with the imports already made: a kernel for a fraction of a second of CPU instead of the several
seconds its imports take (``course/kernel_zygote.py``). With ``"launcher_args"`` in the request (a sandboxed kernel:
the sandbox launcher's arguments), the child instead makes the kernel's sandbox as the launcher would, enters it and
forks the kernel there (``run_sandboxed_child``).

With ``--cuda`` (a kernel started ahead) it also creates its CUDA context before it answers, leaving no memory
allocated and no peak recorded: 0.15 s alone, 0.6-0.8 s with eight processes creating theirs at once on the lent
H100 (``scripts/gpu/start_costs.py``), otherwise paid in the submission's first GPU cell.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Options of this script, and the kernel's arguments (after ``--``)."""
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="kernel_boot.py")
    parser.add_argument("--files", required=True, help="instructor files to copy into the working folder")
    parser.add_argument("--work", help="the kernel's working folder (created; required but with --zygote)")
    parser.add_argument("--on-path", action="store_true", help="put --files first on sys.path")
    parser.add_argument("--uid", type=int, help="run the kernel as this uid and gid (needs root)")
    parser.add_argument("--preload", default="", help="modules to import before the kernel answers (comma-separated)")
    parser.add_argument("--cuda", action="store_true", help="create the CUDA context before the kernel answers")
    parser.add_argument("--zygote", action="store_true", help="import once, then fork a kernel per request on stdin")
    return parser.parse_args(argv[:split]), argv[split + 1:]


def give_tree(folder: str, uid: int) -> None:
    """chown -R to uid/gid ``uid``, following no symlink and staying on this filesystem (not into a bind mount)."""
    for parent, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not os.path.ismount(os.path.join(parent, d))]
        for name in [".", *dirs, *files]:
            os.chown(os.path.join(parent, name), uid, uid, follow_symlinks=False)


def become(uid: int) -> None:
    """Drop root for good: uid and gid ``uid``, no supplementary groups (every thread; capabilities go too)."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise SystemExit(f"kernel_boot: could not become uid {uid}")


def preload(modules: str) -> None:
    """Import each module of the comma-separated ``modules``; one that fails is left for the cell that imports it."""
    import importlib

    for name in filter(None, (part.strip() for part in modules.split(","))):
        try:
            importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - the student's own import of it then shows the error
            pass


def create_cuda_context() -> None:
    """Create torch's CUDA context where torch is imported and sees a GPU, then leave the allocator as a fresh
    process has it: nothing allocated or reserved, no peak, no counts."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    try:
        if not torch.cuda.is_available():
            return
        torch.empty(1, device="cuda")
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.reset_accumulated_memory_stats()
    except Exception:  # noqa: BLE001 - the student's first CUDA call then meets the same error
        pass


def freeze_heap() -> None:
    """Collect start-up's garbage, then move every surviving object out of the collector's reach (``gc.freeze``).

    Importing torch, pandas, matplotlib and transformers leaves some 400,000 objects that the cyclic collector
    would walk on every full collection: 0.1 to 0.3 s each, and ``utils.benchmark_memory`` runs one per call (Lab 1
    calls it a dozen times). Frozen objects are still freed by reference counting; only a reference cycle through
    one of them (an object of the notebook stored inside an imported module's container, and both dropped) is never
    collected.
    """
    import gc

    gc.collect()
    gc.freeze()


# Set for the zygote's imports where its environment does not say otherwise (each forked kernel takes its worker's):
# torch answers torch.cuda.is_available() (utils' DEVICE) through NVML instead of initialising CUDA, which a forked
# child could not use; pyarrow (transformers imports it on some machines) starts no allocator thread.
FORK_SAFE_ENV = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1", "ARROW_DEFAULT_MEMORY_POOL": "system",
                 "JE_ARROW_MALLOC_CONF": "background_thread:false", "MALLOC_CONF": "background_thread:false"}


# Namespaces a kernel forked from a zygote joins, as setns(2) flags: the user namespace first (it owns the others), the
# PID namespace last (it applies to the children made after it).
NAMESPACES = (("user", 0x10000000), ("mnt", 0x00020000), ("ipc", 0x08000000), ("net", 0x40000000),
              ("uts", 0x04000000), ("cgroup", 0x02000000), ("pid", 0x20000000))


def _libc():
    import ctypes
    import ctypes.util

    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        import ctypes

        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def enter_sandbox(pid: int) -> None:
    """Join every namespace of process ``pid`` (a sandbox's) that this process is not in, and take its root folder
    as ours, as ``nsenter --all --root`` does. Joining the PID namespace places the children made after it there.
    A single-threaded process only (a zygote's child); it needs the rights bwrap had (root, or the owner of the
    sandbox's user namespaces).

    Unprivileged, bwrap nests two user namespaces: the outer one owns the mount and the other namespaces, and the
    process ends in the inner one (``ioctl NS_GET_USERNS``). This joins the outer one, then the others, then the
    inner one, as that is the only order in which each join is allowed.
    """
    import fcntl

    ns_get_userns = 0xB701  # _IO(0xb7, 0x1): the user namespace that owns a namespace
    libc = _libc()
    opened = []  # every descriptor, closed at the end

    def open_ns(path: str) -> int:
        opened.append(os.open(path, os.O_RDONLY))
        return opened[-1]

    ours = {name: os.stat(f"/proc/self/ns/{name}") for name, _ in NAMESPACES if os.path.exists(f"/proc/self/ns/{name}")}

    def differs(fd: int, name: str) -> bool:  # from ours before any join: /proc then changes under us
        theirs = os.fstat(fd)
        return (theirs.st_dev, theirs.st_ino) != (ours[name].st_dev, ours[name].st_ino)

    def join(fd: int, flag: int, name: str) -> None:
        _check(libc.setns(fd, flag), f"setns into the sandbox's {name} namespace")

    try:
        targets = {}
        for name, flag in NAMESPACES:
            if os.path.exists(f"/proc/{pid}/ns/{name}"):  # a namespace this kernel has
                targets[name] = (open_ns(f"/proc/{pid}/ns/{name}"), flag)
        root = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY)  # opened before /proc changes under us
        opened.append(root)
        user_fd, user_flag = targets.pop("user")
        inner_user, outer = differs(user_fd, "user"), None
        if inner_user:
            outer = fcntl.ioctl(targets["mnt"][0], ns_get_userns)
            opened.append(outer)
            if differs(outer, "user"):
                join(outer, user_flag, "outer user")
        for name, (fd, flag) in targets.items():
            if differs(fd, name):
                join(fd, flag, name)
        os.fchdir(root)
        os.chroot(".")
        os.chdir("/")
        if inner_user and (outer is None or (os.fstat(outer).st_ino != os.fstat(user_fd).st_ino)):
            join(user_fd, user_flag, "user")
    finally:
        for fd in opened:
            os.close(fd)


def drop_capabilities(keep_permitted: bool) -> None:
    """Nothing to gain by exec (no_new_privs), an empty capability bounding set and no ambient capabilities; unless
    ``keep_permitted`` (root, which ``become`` then leaves for a uid of its own), no capability at all either.
    Checked in ``/proc/self/status``."""
    import ctypes

    libc = _libc()
    pr_set_no_new_privs, pr_capbset_drop, pr_cap_ambient, pr_cap_ambient_clear_all = 38, 24, 47, 4
    _check(libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    with open("/proc/sys/kernel/cap_last_cap") as handle:
        last_cap = int(handle.read())
    for cap in range(last_cap + 1):
        _check(libc.prctl(pr_capbset_drop, cap, 0, 0, 0), f"prctl(PR_CAPBSET_DROP, {cap})")
    _check(libc.prctl(pr_cap_ambient, pr_cap_ambient_clear_all, 0, 0, 0), "prctl(PR_CAP_AMBIENT_CLEAR_ALL)")
    if not keep_permitted:
        class Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

        class Data(ctypes.Structure):
            _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                        ("inheritable", ctypes.c_uint32)]

        _check(libc.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)()), "capset(none)")  # version 3
    with open("/proc/self/status") as handle:
        status = dict(line.split(":", 1) for line in handle if ":" in line)
    names = ("CapBnd", "CapAmb") if keep_permitted else ("CapBnd", "CapAmb", "CapEff", "CapPrm", "CapInh")
    if any(int(status[name], 16) for name in names) or status["NoNewPrivs"].strip() != "1":
        raise SystemExit("kernel_boot: capabilities are left after dropping them")


def _load_sandbox():
    """``course/sandbox.py`` (beside this file; standard library only), for a zygote's sandboxed children."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("efficient_ai_sandbox", os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "sandbox.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_sandboxed_child(request: dict, files: str, zygote: int, zygote_dirs: list[str]) -> int:
    """In a zygote's child: make the kernel's sandbox as the launcher would (``sandbox.start_for_fork``), enter it,
    and run the kernel in a child of ours inside it (the PID namespace's); this process waits for it and keeps the
    sandbox alive while it runs, and ends with the zygote (pid ``zygote``): so do the sandbox and the kernel, which
    does not watch its parent.

    ``zygote_dirs``: the zygote's HOME (and TMPDIR, where it differs). The sandbox shows them as links to the kernel's
    own HOME, and the kernel's HOME gets a copy of what the imports left in the zygote's (``read_tree``): what they
    found or made there (matplotlib's config and cache folders, its font list) is then the kernel's, as it is for a
    kernel whose own imports made it. Returns the kernel's exit status."""
    pr_set_pdeathsig = 1
    _check(_libc().prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != zygote:
        raise SystemExit("kernel_boot: the zygote ended before its kernel started")
    home = read_tree(zygote_dirs[0]) if zygote_dirs else []  # the sandbox will not show it
    made = _load_sandbox().start_for_fork(request["launcher_args"], files, home_at=zygote_dirs)
    if threads() != 1:  # setns into a mount or user namespace refuses a process that shares its file system info
        raise SystemExit(f"kernel_boot: {threads()} threads before entering the sandbox, where one may")
    enter_sandbox(made["pid"])
    kernel = os.fork()
    if kernel == 0:
        def run_kernel() -> None:
            made["process"].stdin.close()  # the placeholder's pipes are ours (this process's parent's)
            made["process"].stdout.close()
            close_inherited_fds()
            take_environment(made["env"])
            write_tree(home, os.path.expanduser("~"))
            drop_capabilities(keep_permitted="--uid" in made["boot"])
            size_torch_threads()
            main([*made["boot"], "--IPKernelApp.parent_handle=1"], imported=True)

        run_then_exit(run_kernel)
    _, status = os.waitpid(kernel, 0)
    return os.waitstatus_to_exitcode(status)


def run_then_exit(body) -> None:
    """End this forked process with what ``body()`` came to: its return value (None: 0), a ``SystemExit``'s code, or
    1 after an uncaught error, printed to stderr (the kernel's log) as it would be. Never returns."""
    code = 1
    try:
        result = body()
        code = 0 if result is None else result
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - into the kernel's log, as an uncaught error would go
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


HOME_COPY_MAX_BYTES = 32 * 2**20  # a zygote's HOME holds what its imports wrote: matplotlib's font list, some kB


def read_tree(folder: str, max_bytes: int = HOME_COPY_MAX_BYTES) -> list[tuple[str, bytes | None]]:
    """The folders (``None``) and regular files (their bytes, up to ``max_bytes`` in all) under ``folder``, as paths
    relative to it, parents first; links and anything else are left out."""
    entries, total = [], 0
    for parent, _, names in os.walk(folder):
        relative = os.path.relpath(parent, folder)
        if relative != ".":
            entries.append((relative, None))
        for name in sorted(names):
            path = os.path.join(parent, name)
            if os.path.islink(path) or not os.path.isfile(path) or total + os.path.getsize(path) > max_bytes:
                continue
            with open(path, "rb") as handle:
                data = handle.read()
            total += len(data)
            entries.append((os.path.normpath(os.path.join(relative, name)), data))
    return entries


def write_tree(entries: list[tuple[str, bytes | None]], folder: str) -> None:
    """Make ``read_tree``'s folders and files under ``folder``."""
    for relative, data in entries:
        path = os.path.join(folder, relative)
        if data is None:
            os.makedirs(path, exist_ok=True)
        else:
            with open(path, "wb") as handle:
                handle.write(data)


def close_inherited_fds() -> None:
    """Close every file descriptor but 0-2 (the kernel's stdin and log), so that nothing opened outside the sandbox
    (a folder, a pipe) is reachable in it. A zygote's imports keep none open, so this closes what none of them owns."""
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2:
            try:
                os.close(int(name))
            except OSError:  # the listing's own descriptor, closed already
                pass


def size_torch_threads() -> None:
    """Size torch's thread pools to OMP_NUM_THREADS (the zygote sized them for itself). This may start threads:
    call it in the kernel's own process, after any namespace is joined."""
    count = os.environ.get("OMP_NUM_THREADS", "")
    if "torch" in sys.modules and count.isdigit() and int(count) > 0:
        sys.modules["torch"].set_num_threads(int(count))


def take_environment(env: dict[str, str]) -> None:
    """Replace this process's environment with ``env``, and forget what Python computed from the one it had:
    ``tempfile``'s folder (the zygote's TMPDIR, which a forked kernel's sandbox does not hold)."""
    import tempfile

    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None


def threads() -> int:
    """This process's threads (Linux; 1 elsewhere)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def serve_forks(options: argparse.Namespace) -> None:
    """``--zygote``: import what every kernel imports, then fork one kernel per request on stdin until it closes.

    Nothing a fork cannot carry is made before the fork: no CUDA (``--cuda`` runs in each child), no ZeroMQ context
    and no socket (the child's ``IPKernelApp`` makes them). BLAS pools started by the imports (OpenBLAS) shut down
    before a fork and start again when next used, in the parent and the child alike.
    """
    import gc
    import json
    import warnings

    if options.on_path:
        sys.path.insert(0, options.files)
    for name, value in FORK_SAFE_ENV.items():
        os.environ.setdefault(name, value)
    import ipykernel.kernelapp  # noqa: F401 - imported for every child

    preload(options.preload)
    torch = sys.modules.get("torch")
    cuda_started = bool(torch is not None and torch.cuda.is_initialized())
    gc.collect()
    gc.freeze()  # what the imports made stays out of every child's collections, and its pages stay shared
    warnings.filterwarnings("ignore", message=".*multi-threaded.*fork", category=DeprecationWarning)
    quiet_fork = warnings.filters[0]  # the zygote's own: each child takes it out again
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the system: no zombies
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything an import prints goes to stderr, never into the answers
    answers.write(json.dumps({"ready": not cuda_started, "threads": threads(),
                              "why": "the imports initialised CUDA" if cuda_started else ""}) + "\n")
    answers.flush()
    zygote = os.getpid()
    zygote_dirs = list(dict.fromkeys(os.environ[name] for name in ("HOME", "TMPDIR")  # HOME first
                                     if os.path.isabs(os.environ.get(name, ""))))
    for line in sys.stdin:
        try:
            request = json.loads(line)
            pid = os.fork()
        except (ValueError, OSError) as exc:
            answers.write(json.dumps({"error": str(exc)}) + "\n")
            answers.flush()
            continue
        if pid == 0:
            def run_kernel() -> int | None:
                answers.close()
                os.setsid()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)
                os.dup2(log, 1)
                os.dup2(log, 2)
                os.close(devnull)
                os.close(log)
                if quiet_fork in warnings.filters:
                    warnings.filters.remove(quiet_fork)
                take_environment(request["env"])  # the worker's, as a kernel it started would have
                if request.get("cpus") and hasattr(os, "sched_setaffinity"):
                    os.sched_setaffinity(0, request["cpus"])
                if request.get("launcher_args"):  # a sandboxed kernel
                    return run_sandboxed_child(request, options.files, zygote, zygote_dirs)
                size_torch_threads()
                # ipykernel read JPY_PARENT_PID when the zygote imported it: the kernel ends with the zygote
                args = [*request["args"], *([] if "--" in request["args"] else ["--"])]
                main([*args, f"--IPKernelApp.parent_handle={os.getppid()}"], imported=True)
                return None

            run_then_exit(run_kernel)
        answers.write(json.dumps({"pid": pid}) + "\n")
        answers.flush()


def main(argv: list[str], imported: bool = False) -> None:
    """Start the kernel (``imported``: in a child of ``--zygote``, whose imports are made)."""
    options, kernel_args = parse(argv)
    if options.zygote:
        serve_forks(options)
        return
    if not options.work:
        raise SystemExit("kernel_boot: --work is required")
    shutil.copytree(options.files, options.work, symlinks=True, dirs_exist_ok=True)
    if options.on_path and not (imported and options.files in sys.path):
        sys.path.insert(0, options.files)
    from ipykernel.kernelapp import IPKernelApp

    app = IPKernelApp.instance()
    app.initialize(["--IPKernelApp.ignore_cwd=True", *kernel_args])
    if options.uid is not None:
        give_tree(options.work, options.uid)
        give_tree(os.path.expanduser("~"), options.uid)  # what IPython made there (its profile, history)
        become(options.uid)
    os.chdir(options.work)
    preload(options.preload)
    if options.cuda:
        create_cuda_context()
    freeze_heap()
    app.start()


if __name__ == "__main__":
    main(sys.argv[1:])
