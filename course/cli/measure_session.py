"""One measuring kernel: started as grading starts its kernels (the course's ``nbgrader_config.py``, whose
``configure_sandbox`` selects ``course/grader/sandbox.py``'s launcher: isolated start, bubblewrap sandbox where it works,
GPU visible, no network, no course folder, process and file caps), driven by the measuring process with time limits.

What crosses back is text the measuring process parses as plain data (``evaluate``); nothing the kernel reports about
itself (reply status, error text) decides more than its own row, and error text is only shown.
"""
from __future__ import annotations

import ast
import functools
import os
import queue
import shutil
import tempfile
import time
from pathlib import Path

from ..common.paths import KERNEL_DIR

INTERRUPT_GRACE_S = 10.0  # after an interrupt, how long a kernel may take to answer before it is killed
START_TIMEOUT_S = 120.0
PROBE_NAME = "_efficient_ai_probe"
PROBE_FILE = KERNEL_DIR / "measure_probe.py"  # run in the kernel


@functools.lru_cache(maxsize=None)
def course_config(course_root: Path):
    """The traitlets config of the course's ``nbgrader_config.py`` (its ``c.Sandbox`` settings: the kernel limits
    ``use_sandbox`` applies).

    Raises:
        SystemExit: the file is missing or cannot load (it refuses without the course tooling).
    """
    from traitlets.config.loader import PyFileConfigLoader

    if not (course_root / "nbgrader_config.py").exists():
        raise SystemExit(f"{course_root} has no nbgrader_config.py: pass --course-dir of a course folder")
    return PyFileConfigLoader("nbgrader_config.py", path=str(course_root)).load_config()


class KernelLost(Exception):
    """The kernel died, or did not answer in time and was killed; ``str()`` says which."""


class MeasureKernel:
    """A sandboxed kernel for one submission of ``lab``, with ``env`` (CUDA_VISIBLE_DEVICES, the scale) added."""

    def __init__(self, course_root: Path, lab: str, env: dict[str, str]):
        from jupyter_client import KernelManager

        from ..grader.sandbox import use_sandbox

        config = course_config(course_root)
        self.scratch = Path(tempfile.mkdtemp(prefix="efficient-ai-measure-"))
        work = self.scratch / lab  # the launcher copies source/<lab>/'s instructor files for a folder of this name
        work.mkdir()
        self.km = KernelManager(config=config)
        use_sandbox(self.km)  # the grading kernels' provisioner: the same sandbox, a socket folder of its own
        self.km.start_kernel(cwd=str(work), env={**os.environ, **env})
        self.kc = self.km.client()
        self.kc.start_channels()
        try:
            self.kc.wait_for_ready(timeout=START_TIMEOUT_S)
        except RuntimeError as exc:
            self.close()
            raise KernelLost(f"the kernel did not start ({exc})") from None

    def _reply(self, msg_id: str, timeout_s: float) -> dict:
        """The shell reply to ``msg_id``; KernelLost when the kernel dies, or when it has not answered within
        ``timeout_s`` and an interrupt (then ``INTERRUPT_GRACE_S``) did not bring an answer (it is then killed)."""
        deadline, interrupted = time.monotonic() + timeout_s, False
        while True:
            if time.monotonic() > deadline:
                if interrupted:
                    self.close()
                    raise KernelLost(f"timed out after {timeout_s:.0f} s (killed: no answer to an interrupt)")
                self.km.interrupt_kernel()
                deadline, interrupted = time.monotonic() + INTERRUPT_GRACE_S, True
            try:
                msg = self.kc.get_shell_msg(timeout=0.5)
            except queue.Empty:
                if not self.km.is_alive():
                    self.close()
                    raise KernelLost("the kernel died") from None
                continue
            if msg["parent_header"].get("msg_id") == msg_id:
                if interrupted:
                    raise KernelLost(f"timed out after {timeout_s:.0f} s (interrupted)")
                return msg["content"]

    def run(self, code: str, timeout_s: float) -> str | None:
        """Run ``code`` silently; None when it ran, else the error the kernel reported (text, for the row only).

        Raises:
            KernelLost: it died or ran past ``timeout_s``.
        """
        content = self._reply(self.kc.execute(code, silent=True, store_history=False, allow_stdin=False), timeout_s)
        if content.get("status") == "ok":
            return None
        return f"{content.get('ename', 'Error')}: {content.get('evalue', '')}"[:400]

    def evaluate(self, expression: str, timeout_s: float) -> str:
        """The value of ``expression``, which must be a ``str`` in the kernel, as that string.

        Raises:
            KernelLost: it died or ran past ``timeout_s``.
            ValueError: the kernel's answer is not a plain string (a broken or forged reply).
        """
        msg_id = self.kc.execute("", silent=True, store_history=False, allow_stdin=False,
                                 user_expressions={"value": expression})
        content = self._reply(msg_id, timeout_s)
        value = (content.get("user_expressions") or {}).get("value") or {}
        if value.get("status") != "ok":
            raise ValueError(f"{value.get('ename', 'no answer')}: {value.get('evalue', '')}"[:400])
        text = ast.literal_eval(value.get("data", {}).get("text/plain", ""))
        if not isinstance(text, str):
            raise ValueError(f"the answer is a {type(text).__name__}, not a string")
        return text

    def install_probe(self, timeout_s: float) -> str | None:
        """Define ``PROBE_NAME(request_json)`` in the kernel: ``measure_probe.probe`` over the user namespace, run
        from the course's file in a namespace with its own builtins. None when installed, else the error text."""
        source = PROBE_FILE.read_text()
        code = (
            "import builtins as _b, functools as _f\n"
            "_g = {'__builtins__': dict(vars(_b)), '__name__': '_efficient_ai_measure'}\n"
            f"exec(compile({source!r}, '<course measure probe>', 'exec'), _g)\n"
            f"{PROBE_NAME} = _f.partial(_g['probe'], get_ipython().user_ns)\n"
            "del _b, _f, _g\n"
        )
        return self.run(code, timeout_s)

    def close(self) -> None:
        """Kill the kernel (and everything it started: the sandbox's PID namespace) and remove its folder."""
        try:
            self.kc.stop_channels()
            if self.km.has_kernel:
                self.km.shutdown_kernel(now=True)
        except Exception:  # noqa: BLE001 - it may be gone already
            pass
        shutil.rmtree(self.scratch, ignore_errors=True)
