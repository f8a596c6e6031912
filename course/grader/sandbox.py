"""Grading kernels: started isolated from student files and, where bubblewrap works, sandboxed.

``SandboxProvisioner`` is jupyter_client's kernel provisioner for grading kernels (entry point
``efficient-ai-sandbox``, pyproject.toml). ``use_sandbox(km)`` makes a kernel manager start its kernels through it:
``GuardedExecute`` does for every notebook nbgrader grades (``course grade``, plain ``nbgrader autograde``, the
formgrader's Autograde button), ``course measure`` for its kernels. Each kernel gets a private folder holding a copy
of the lab's instructor files and starts as ``kernel_boot.py`` with only that copy on ``sys.path``; sandboxed, inside
the allow-list of ``course/kernel/bwrap.py``, with the limits of ``c.Sandbox`` (``course/grader/settings.py``) applied by
``course/kernel/kernel_limits.py``. ``configure_sandbox(c)`` (end of ``nbgrader_config.py``) refuses to grade, or warns, when
the sandbox cannot work here. What each defence stops: docs/SECURITY.md.
"""
from __future__ import annotations

import functools
import glob
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import uuid

from jupyter_client.kernelspec import NATIVE_KERNEL_NAME, KernelSpec, KernelSpecManager
from jupyter_client.provisioning import LocalProvisioner

from ..common.paths import REPO_ROOT
from ..kernel import bwrap
from .settings import Sandbox, apply_environment

PROVISIONER_NAME = "efficient-ai-sandbox"  # its jupyter_client.kernel_provisioners entry point
FOLDER_PREFIX = "efficient-ai-kernel-"  # + the grading process's id: one folder per kernel manager, under /tmp
KERNEL_UID_BASE = 2_000_000_000  # + (grading process id << 5) + its kernel's number: a uid no one else uses
KERNELS_PER_PROCESS_BITS = 5  # kernel numbers of one grading process that get distinct uids (a pid has <= 22 bits)
INSTRUCTOR_FILES_IGNORE = ("*.ipynb", ".ipynb_checkpoints", "__pycache__", "*.pyc")
REPOSITORY = str(REPO_ROOT)  # hidden from kernels like a course
_kernel_numbers = itertools.count()  # this process's kernels, numbered for their uids


# Config time (nbgrader_config.py) and the decision each kernel start repeats.
def configure_sandbox(c) -> None:
    """Check, when ``nbgrader_config.py`` loads, that grading kernels can run as ``c.Sandbox.mode`` (or
    EFFICIENT_AI_SANDBOX) asks; warn once per process when ``auto`` finds no working sandbox.

    Args:
        c: the traitlets config object of ``nbgrader_config.py``.

    Raises:
        SystemExit: the mode is ``on`` and bwrap does not work here (traitlets would only log an Exception).
    """
    apply_environment(c, ("Sandbox",))
    try:
        sandbox_reason(Sandbox(config=c).mode)
    except RuntimeError as exc:
        raise SystemExit(str(exc)) from None


def sandbox_reason(mode: str) -> str | None:
    """Why kernels started under sandbox ``mode`` run outside the sandbox, or None when they run in it.

    Raises:
        RuntimeError: the mode is ``on`` and the sandbox does not work here.
    """
    if mode == "off":
        return "the sandbox mode is 'off'"
    reason = unavailable_reason()
    if reason is not None and mode == "on":
        raise RuntimeError(f"the sandbox mode is 'on' (c.Sandbox.mode, or EFFICIENT_AI_SANDBOX=on), but grading "
                           f"kernels cannot be sandboxed: {reason}.")
    if reason is not None:
        _say_once(f"WARNING: grading is NOT sandboxed: {reason}. Student code runs with this account's rights and can "
                  "read source/, the gradebook and other submissions. Install bubblewrap to fix this; set "
                  "c.Sandbox.mode = 'on' (or EFFICIENT_AI_SANDBOX=on) to refuse grading without a sandbox, or 'off' "
                  "to silence this warning.")
    return reason


@functools.cache
def _say_once(message: str) -> None:
    print(message, file=sys.stderr)


def unavailable_reason() -> str | None:
    """Why bwrap cannot sandbox kernels here, or None when it can (cached per Python, bwrap, uid, installation and
    library path). It runs this Python in a kernel's sandbox: one that cannot run there would score every kernel 0."""
    if not sys.platform.startswith("linux"):
        return f"the sandbox needs Linux (this is {sys.platform})"
    found = shutil.which("bwrap")
    if found is None:
        return "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    return _probe(sys.executable, found, os.geteuid(), tuple(bwrap.installed_dirs()), os.environ.get("LD_LIBRARY_PATH"))


@functools.lru_cache(maxsize=None)
def _probe(python: str, found: str, _uid: int, installed: tuple[str, ...], _library_path: str | None) -> str | None:
    """``unavailable_reason``'s check of bwrap ``found`` and of ``python`` inside it (the other arguments key the
    cache)."""
    if overlapping := [d for d in installed if bwrap.inside(d, bwrap.WORK_DIR) or bwrap.inside(bwrap.WORK_DIR, d)]:
        return (f"the Python installation or compiler at {overlapping[0]} overlaps the sandbox's working folder "
                f"{bwrap.WORK_DIR}: install it elsewhere (a venv under /var/tmp or the home folder, say)")
    sandbox = bwrap.sandbox_args(list(installed), 65536, [], [], [], dict(os.environ))  # --size needs bwrap 0.7+
    try:
        result = subprocess.run([*sandbox, python, "-I", "-c", "pass"], capture_output=True, text=True, timeout=30)
        version = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bwrap did not run: {exc}"
    if result.returncode != 0:
        if subprocess.run([*sandbox, "true"], capture_output=True, timeout=30).returncode == 0:  # only Python fails
            return (f"{python} does not run inside the sandbox ({result.stderr.strip()[:300]}); it shows "
                    f"read-only {', '.join(installed) or 'only /usr'} besides /usr")
        hint = "; unprivileged user namespaces may be disabled: grade as root, or allow them" if os.geteuid() else ""
        return f"{version} fails here ({result.stderr.strip()[:300]}): it needs 0.7 or newer, not setuid{hint}"
    return None


# The kernel manager's side: which kernelspec and provisioner grading kernels have.
def use_sandbox(km) -> None:
    """Make kernel manager ``km`` (jupyter_client's, blocking or async, not yet started) start its kernels as grading
    kernels: through ``SandboxProvisioner``, configured by ``km``'s config (``c.Sandbox``, ``c.CourseDirectory``),
    whatever kernelspec a notebook names. ``GuardedExecute`` and ``course measure`` call it."""
    km.kernel_name = NATIVE_KERNEL_NAME  # nbclient then keeps IPython's history in memory
    km.kernel_spec_manager = GradingKernelSpecs(parent=km)
    km.kernel_id = km.kernel_id or str(uuid.uuid4())
    # Set here rather than found through the entry point: a course run from its folder, not installed (the grading
    # image), grades the same.
    km.provisioner = SandboxProvisioner(kernel_id=km.kernel_id, kernel_spec=km.kernel_spec, parent=km)


class GradingKernelSpecs(KernelSpecManager):
    """The one kernelspec of grading kernels, whatever name is asked for: this Python's IPython kernel, started by
    ``SandboxProvisioner`` and interrupted by a message (a sandboxed kernel has a session of its own, out of reach of
    SIGINT). Built in memory: no kernel.json is written or looked up."""

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        return KernelSpec(
            name=NATIVE_KERNEL_NAME, argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            display_name="Python 3 (grading)", language="python", interrupt_mode="message",
            metadata={"kernel_provisioner": {"provisioner_name": PROVISIONER_NAME}},
        )


class SandboxProvisioner(LocalProvisioner):
    """jupyter_client's local provisioner, starting each kernel isolated and, where bubblewrap works, sandboxed.

    Its kernel manager's config gives the sandbox's options (``c.Sandbox``) and the course folders to hide
    (``c.CourseDirectory``). Over ipc transport when sandboxed (the kernel has no network).
    """

    folder: str | None = None  # this kernel manager's folder: ipc sockets, and one folder per kernel started
    launch_dir: str | None = None  # the current kernel's: instructor files, passwd, connection file

    async def pre_launch(self, **kwargs):
        """jupyter_client's start of a kernel, with the grading kernel's command (``cmd``) and working folder."""
        options = Sandbox(parent=self)
        sandboxed = sandbox_reason(options.mode) is None
        km = self.parent
        if self.folder is None:
            self.folder = _new_folder()
        if sandboxed:  # before the connection file is written
            km.transport, km.ip = "ipc", os.path.join(self.folder, "ipc", "kernel")
            os.makedirs(os.path.dirname(km.ip), exist_ok=True)
        extra_arguments = list(kwargs.get("extra_arguments", []))
        cwd = os.path.abspath(kwargs.get("cwd") or os.getcwd())
        kwargs = await super().pre_launch(**kwargs)  # writes the connection file, prepares the environment
        kernel_args = ["-f", km.connection_file, *extra_arguments]
        self.launch_dir = tempfile.mkdtemp(prefix="kernel-", dir=self.folder)
        hidden = self._hidden_folders(km.connection_file)
        on_path = prepare_files(cwd, self._source_root(), hidden, os.path.join(self.launch_dir, "files"))
        boot_options = ["--on-path"] if on_path else []
        limits = options.limits(cuda_devices=bool(glob.glob("/dev/nvidia[0-9]*")))
        if sandboxed:
            if options.memory_gb and not limits.address_space_bytes:
                _say_once("sandbox: CUDA devices present, so the kernel's address-space cap is not applied "
                          "(CUDA reserves far more virtual memory than it uses)")
            command = bwrap.kernel_command(self.launch_dir, km.connection_file, os.path.dirname(km.ip), kernel_args,
                                           boot_options, _kernel_uid(), limits, hidden, kwargs["env"])
        else:
            limits = limits.cpus_only()
            command = [sys.executable, "-I", bwrap.BOOT_SCRIPT, *boot_options, "--files",
                       os.path.join(self.launch_dir, "files"), "--work", os.path.join(self.launch_dir, "work"), "--",
                       *kernel_args]
        kwargs["cmd"] = limits.command(command)
        kwargs["cwd"] = self.launch_dir  # never the submission's folder
        return kwargs

    async def cleanup(self, restart: bool = False) -> None:
        """Remove the ended kernel's folder; the whole folder when no kernel follows."""
        await super().cleanup(restart=restart)
        if self.launch_dir:
            shutil.rmtree(self.launch_dir, ignore_errors=True)
            self.launch_dir = None
        if not restart and self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def _source_root(self) -> str:
        course = self.config.get("CourseDirectory", {})
        return os.path.join(os.path.abspath(course.get("root") or os.getcwd()), course.get("source_directory") or "source")

    def _hidden_folders(self, connection_file: str) -> list[str]:
        """The folders a kernel must not see: the grading process's, the course's, a SQLite gradebook's, this
        repository, the temporary and home folders, and jupyter's runtime folder (connection files)."""
        course = self.config.get("CourseDirectory", {})
        db_url = course.get("db_url") or ""
        sqlite = db_url[len("sqlite:///"):] if db_url.startswith("sqlite:///") else None
        folders = [os.getcwd(), course.get("root"), sqlite and os.path.dirname(os.path.abspath(sqlite)), REPOSITORY,
                   tempfile.gettempdir(), os.path.expanduser("~"), os.path.dirname(connection_file)]
        return sorted({os.path.abspath(f) for f in folders if f})


def _kernel_uid() -> int | None:
    """The uid a sandboxed kernel becomes, one no other kernel has; None when grading does not run as root."""
    if os.geteuid() != 0:
        return None
    number = next(_kernel_numbers) % (1 << KERNELS_PER_PROCESS_BITS)
    return KERNEL_UID_BASE + (os.getpid() << KERNELS_PER_PROCESS_BITS) + number


def _new_folder() -> str:
    """A fresh private folder for one kernel manager's kernels, after removing those of grading processes that
    ended without cleaning up (killed at a time limit)."""
    for folder in glob.glob(f"/tmp/{FOLDER_PREFIX}*"):
        try:
            os.kill(int(folder[len(f"/tmp/{FOLDER_PREFIX}"):].split("-")[0]), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except (ValueError, PermissionError):
            pass
    # Short path under /tmp: ipc socket paths must stay under about 100 characters.
    return tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-", dir="/tmp")


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
    if any(bwrap.inside(os.path.realpath(h), cwd) for h in hidden if h):
        os.mkdir(dest)
        print(f"sandbox: the kernel's folder {cwd} holds private files, so the kernel starts in an empty copy",
              file=sys.stderr)
    else:
        shutil.copytree(cwd, dest, symlinks=True, ignore=shutil.ignore_patterns("*.ipynb"))
    return False
