"""The grader's own requests to a grading kernel, beside the cells nbclient runs: silent requests and comm messages,
reads that give up after a time, and reconnecting after ZeroMQ dropped an oversized message. ``KernelLoss`` says why
a kernel is lost, in every module that asks."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from queue import Empty

import zmq
from jupyter_client.asynchronous import AsyncKernelClient
from nbclient.exceptions import DeadKernelError
from nbclient.util import ensure_async, run_sync

# How long the grader waits for the kernel to answer one of its own requests; a healthy kernel answers in ms.
KERNEL_REPLY_TIMEOUT_S = 60
INTERRUPT_GRACE_S = 10  # after interrupting a request still running, how long its answer may take
MAX_MESSAGE_BYTES = 8 << 20  # ZeroMQ drops a larger kernel message unread (docs/SECURITY.md)

# Run in every grading kernel before student code: cuDNN's attention prepares each shape on the CPU in every new
# process, and the other attention kernels give the same results.
GRADING_KERNEL_SETTINGS = (
    "import sys as _s\n"
    "if 'torch' in _s.modules and hasattr(_s.modules['torch'].backends.cuda, 'enable_cudnn_sdp'):\n"
    "    _s.modules['torch'].backends.cuda.enable_cudnn_sdp(False)\n"
    "del _s\n"
)


@dataclasses.dataclass(frozen=True)
class KernelLoss:
    """Why a grading kernel is lost: it ``died`` (its process ended), or it stopped answering (``detail``: how long
    the grader waited). ``str()`` completes "the kernel ...": "died", "stopped answering (no reply in 60 s)"."""

    died: bool
    detail: str = ""

    def __str__(self) -> str:
        return "died" if self.died else f"stopped answering ({self.detail})"


DIED = KernelLoss(died=True)


class CappedKernelClient(AsyncKernelClient):
    """jupyter_client's async kernel client whose sockets drop any message over ``MAX_MESSAGE_BYTES`` unread, so a
    kernel cannot make the grader hold a message of any size. ``GuardedExecute`` makes its kernel manager use it."""

    def start_channels(self, *args, **kwargs) -> None:
        # The client's own context (each client makes one): the option reaches this client's sockets only.
        self.context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        super().start_channels(*args, **kwargs)


class KernelChannel:
    """The grader's own requests to one grading kernel, over ``client`` (``manager`` interrupts it). Once the kernel
    is lost (``lost``), no further request is sent: a fresh kernel gets a new channel."""

    def __init__(self, client, manager):
        self.client = client
        self.manager = manager
        self.lost: KernelLoss | None = None

    def lose(self, loss: KernelLoss) -> None:
        """Record that the kernel is lost (the first reason found stays)."""
        self.lost = self.lost or loss

    def run(self, coroutine_function, *args):
        """Run one of this channel's coroutines; None (and the kernel lost) when the kernel died meanwhile."""
        try:
            return run_sync(coroutine_function)(*args)
        except DeadKernelError:
            self.lose(DIED)
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

    def send(self, msg_type: str, content: dict) -> str:
        """Send a message of the grader's own on the shell channel (a comm's, say); its id."""
        msg = self.client.session.msg(msg_type, content)
        self.client.shell_channel.send(msg)
        return msg["header"]["msg_id"]

    async def read(self, pick, timeout_s: float, *, output: bool, interrupt: bool = False):
        """Read the output (``output``, else the shell) channel's messages until ``pick(message)`` returns something
        other than None, and return that; None after ``timeout_s`` seconds. With ``interrupt``, a request still running then is
        interrupted and given ``INTERRUPT_GRACE_S`` more to answer. Raises DeadKernelError when the kernel dies."""
        channel = self.client.iopub_channel if output else self.client.shell_channel
        deadline = time.monotonic() + timeout_s
        while True:
            if time.monotonic() > deadline:
                if not interrupt:
                    return None
                await ensure_async(self.manager.interrupt_kernel())
                interrupt, deadline = False, time.monotonic() + INTERRUPT_GRACE_S
            try:
                msg = await ensure_async(channel.get_msg(timeout=1))
            except Empty:
                if not await ensure_async(self.client.is_alive()):
                    raise DeadKernelError("Kernel died") from None
                continue
            if (picked := pick(msg)) is not None:
                return picked

    async def _request(self, code: str, expression: str | None, timeout_s: float, output: bool = False) -> dict | None:
        """Send a silent request; its reply (with ``output``: its first output message), or None after
        ``timeout_s``."""
        msg_id = self.client.execute(code, silent=True, store_history=False, allow_stdin=False,
                                     user_expressions={"guard": expression} if expression else None)
        return await self.read(lambda msg: msg if msg["parent_header"].get("msg_id") == msg_id else None, timeout_s,
                               output=output)

    def request(self, code: str, expression: str | None = None, timeout_s: float = KERNEL_REPLY_TIMEOUT_S) -> dict | None:
        """Send the kernel a silent request; its reply, or None (and the kernel lost) when none came within
        ``timeout_s`` seconds. ``expression`` is evaluated as the ``guard`` user expression."""
        if self.lost:
            return None
        reply = self.run(self._request, code, expression, timeout_s)
        if reply is None:
            self.lose(KernelLoss(died=False, detail=f"no reply in {timeout_s:.0f} s"))
        return reply

    def reconnect(self) -> None:
        """Connect again on a fresh client (ZeroMQ closes a connection for good after an oversized message), and ask
        for a status until one arrives (a fresh subscription misses earlier messages); none within
        ``KERNEL_REPLY_TIMEOUT_S`` counts as no longer answering. The caller's own client is then ``client``."""
        self.client.stop_channels()
        self.client = self.manager.client()
        self.client.start_channels()
        if not self.run(self._output_arrives):
            self.lose(KernelLoss(died=False, detail=f"no output in {KERNEL_REPLY_TIMEOUT_S} s"))

    async def _output_arrives(self) -> bool:
        deadline = time.monotonic() + KERNEL_REPLY_TIMEOUT_S
        while time.monotonic() < deadline:
            if await self._request("", None, min(2, deadline - time.monotonic()), output=True):
                return True
        return False
