"""Start a grading kernel that no file beside it can shadow (standard library only).

``course/grader/sandbox.py``'s provisioner runs ``python -I kernel_boot.py --files DIR --work DIR [--on-path] [--uid N]
-- KERNEL_ARGUMENTS``, in bwrap or not: ``-I`` and ``ignore_cwd`` keep the working folder and
PYTHONPATH off ``sys.path`` (docs/SECURITY.md)."""
from __future__ import annotations

import argparse
import os
import shutil
import sys


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Options of this script, and the kernel's arguments (after ``--``)."""
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="kernel_boot.py")
    parser.add_argument("--files", required=True, help="instructor files to copy into the working folder")
    parser.add_argument("--work", required=True, help="the kernel's working folder (created)")
    parser.add_argument("--on-path", action="store_true", help="put --files first on sys.path")
    parser.add_argument("--uid", type=int, help="run the kernel as this uid and gid (needs root)")
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


def main(argv: list[str]) -> None:
    """Start the kernel."""
    options, kernel_args = parse(argv)
    shutil.copytree(options.files, options.work, symlinks=True, dirs_exist_ok=True)
    if options.on_path:
        sys.path.insert(0, options.files)
    from ipykernel.kernelapp import IPKernelApp

    app = IPKernelApp.instance()
    app.initialize(["--IPKernelApp.ignore_cwd=True", *kernel_args])
    if options.uid is not None:  # after binding the sockets, whose folder stays root's
        give_tree(options.work, options.uid)
        give_tree(os.path.expanduser("~"), options.uid)  # what IPython made there (its profile, history)
        become(options.uid)
    os.chdir(options.work)
    app.start()


if __name__ == "__main__":
    main(sys.argv[1:])
