"""The grader's own requests to a grading kernel, beside the cells nbclient runs: silent requests, reads that give
up after a time, and reconnecting after ZeroMQ dropped an oversized message."""
from __future__ import annotations

import time
from pathlib import Path
from queue import Empty

from nbclient.exceptions import DeadKernelError
from nbclient.util import ensure_async, run_sync

# How long the grader waits for the kernel to answer one of its own requests; a healthy kernel answers in ms.
KERNEL_REPLY_TIMEOUT_S = 60

# Run in every grading kernel before student code: cuDNN's attention prepares each shape on the CPU in every new
# process, and the other attention kernels give the same results.
GRADING_KERNEL_SETTINGS = (
    "import sys as _s\n"
    "if 'torch' in _s.modules and hasattr(_s.modules['torch'].backends.cuda, 'enable_cudnn_sdp'):\n"
    "    _s.modules['torch'].backends.cuda.enable_cudnn_sdp(False)\n"
    "del _s\n"
)


class KernelChannel:
    """Requests of the grader's own to the kernel of ``owner`` (an nbclient executor, whose ``kc`` and ``km`` change
    when a fresh kernel replaces a lost one). Once the kernel is ``lost``, no further request is sent."""

    def __init__(self, owner):
        self.owner = owner
        self.lost = ""  # "died" or "stopped answering ...": found by a request of the grader's own

    def run(self, coroutine_function, *args):
        """Run one of this channel's coroutines; None (and ``lost`` set to "died") when the kernel died meanwhile."""
        try:
            return run_sync(coroutine_function)(*args)
        except DeadKernelError:
            self.lost = "died"
            return None

    def install(self, source: Path, namespace: str, filename: str, install_call: str, timeout_s: float) -> bool:
        """Run the grader's file ``source`` (shown as ``filename``) in the kernel, in a namespace ``_g`` named
        ``namespace`` with its own copy of the builtins (student code cannot replace them later), then
        ``install_call`` (a statement over ``_g``); whether it succeeded."""
        code = (
            GRADING_KERNEL_SETTINGS +
            "import builtins as _b\n"
            f"_g = {{'__builtins__': dict(vars(_b)), '__name__': {namespace!r}}}\n"
            f"exec(compile({source.read_text()!r}, {filename!r}, 'exec'), _g)\n"
            f"{install_call}\n"
            "del _b, _g\n"
        )
        reply = self.request(code, timeout_s=timeout_s)
        return bool(reply) and reply["content"].get("status") == "ok"

    async def read(self, channel, timeout_s: float, interrupt: bool, pick):
        """Read ``channel``'s messages until ``pick(message)`` returns something other than None, and return that;
        None after ``timeout_s`` seconds. With ``interrupt``, a request still running then is interrupted and given
        10 s more to answer (with the interruption). Raises DeadKernelError when the kernel dies meanwhile."""
        deadline = time.monotonic() + timeout_s
        while True:
            if time.monotonic() > deadline:
                if not interrupt:
                    return None
                await ensure_async(self.owner.km.interrupt_kernel())
                interrupt, deadline = False, time.monotonic() + 10
            try:
                msg = await ensure_async(channel.get_msg(timeout=1))
            except Empty:
                if not await ensure_async(self.owner.kc.is_alive()):
                    raise DeadKernelError("Kernel died") from None
                continue
            if (picked := pick(msg)) is not None:
                return picked

    async def _request(self, code: str, expression: str | None, timeout_s: float, iopub: bool = False) -> dict | None:
        """Send a silent request; its reply (with ``iopub``: its first output message), or None after ``timeout_s``."""
        kc = self.owner.kc
        msg_id = kc.execute(code, silent=True, store_history=False, allow_stdin=False,
                            user_expressions={"guard": expression} if expression else None)
        return await self.read(kc.iopub_channel if iopub else kc.shell_channel, timeout_s, False,
                               lambda msg: msg if msg["parent_header"].get("msg_id") == msg_id else None)

    def request(self, code: str, expression: str | None = None, timeout_s: float = KERNEL_REPLY_TIMEOUT_S) -> dict | None:
        """Send the kernel a silent request; its reply, or None (and ``lost`` set) when none came within
        ``timeout_s`` seconds. ``expression`` is evaluated as the ``guard`` user expression."""
        if self.lost:
            return None
        reply = self.run(self._request, code, expression, timeout_s)
        if reply is None and not self.lost:
            self.lost = f"stopped answering (no reply in {timeout_s:.0f} s)"
        return reply

    def reopen(self) -> None:
        """Connect the shell and output channels again (ZeroMQ closes one for good after an oversized message), and
        ask for a status until one arrives (a fresh subscription misses earlier messages); none within
        ``KERNEL_REPLY_TIMEOUT_S`` counts as no longer answering."""
        for name in ("_iopub_channel", "_shell_channel"):
            if (channel := getattr(self.owner.kc, name, None)) is not None:
                channel.close()
                setattr(self.owner.kc, name, None)
        if not self.run(self._output_arrives) and not self.lost:
            self.lost = f"stopped answering (no output in {KERNEL_REPLY_TIMEOUT_S} s)"

    async def _output_arrives(self) -> bool:
        deadline = time.monotonic() + KERNEL_REPLY_TIMEOUT_S
        while time.monotonic() < deadline:
            if await self._request("", None, min(2, deadline - time.monotonic()), iopub=True):
                return True
        return False
