"""Run by an unprivileged user with the system's Python (standard library only): what a zygote's child does for a
sandboxed kernel (``sandbox.start_for_fork``, ``kernel_boot.enter_sandbox``, then a child that drops its capabilities),
printing what that child sees as one JSON line. Used by tests/test_kernel_zygote.py.

Usage: ``python3 -I unprivileged_fork.py COURSE_PACKAGE_DIR EMPTY_WRITABLE_DIR``.
"""
import importlib.util
import json
import os
import sys


def load(folder: str, name: str):
    spec = importlib.util.spec_from_file_location(f"efficient_ai_{name}", os.path.join(folder, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(course: str, work: str) -> int:
    boot, sandbox = load(course, "kernel_boot"), load(course, "sandbox")
    files = os.path.join(work, "files")
    os.makedirs(files)
    open(os.path.join(files, "utils.py"), "w").close()
    os.makedirs(os.path.join(work, "home", "ipc"))
    os.makedirs(os.path.join(work, "runtime"))
    connection = os.path.join(work, "home", "connection.json")
    with open(connection, "w") as handle:
        json.dump({"transport": "ipc", "ip": os.path.join(work, "home", "ipc", "kernel")}, handle)
    os.environ.update({sandbox.RUNTIME_ENV: os.path.join(work, "runtime"), sandbox.HIDE_ENV: work})
    made = sandbox.start_for_fork(["-f", connection], files)
    boot.enter_sandbox(made["pid"])
    child = os.fork()
    if child == 0:
        made["process"].stdin.close()
        made["process"].stdout.close()
        boot.close_inherited_fds()
        boot.drop_capabilities(keep_permitted=False)
        import ctypes

        status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
        view = {
            "capabilities": {k: int(status[k], 16) for k in ("CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb")},
            "no_new_privs": status["NoNewPrivs"].strip(), "uid": os.getuid(), "cwd": os.getcwd(),
            "instructor_files": sorted(os.listdir(sandbox.FILES_DIR)), "sees_grader_files": os.path.exists(os.path.join(work, "runtime")) or os.path.exists(connection),
            "processes": len([p for p in os.listdir("/proc") if p.isdigit()]),
            "descriptors": len(os.listdir("/proc/self/fd")) - 1,  # without the listing's own
            "can_unshare_mounts": ctypes.CDLL(None, use_errno=True).unshare(0x00020000) == 0,
        }
        print(json.dumps(view), flush=True)
        os._exit(0)
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
