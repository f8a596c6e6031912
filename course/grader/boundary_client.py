"""The grader's end of the grading boundary's comm (``boundary.py``, ``boundary_kernel.py``): installs the server in a
fresh kernel and sends it a test cell's requests, interrupting one still running at the test cell's time limit.
"""
from __future__ import annotations

import secrets
import time

from . import boundary
from .kernel_channel import KERNEL_REPLY_TIMEOUT_S, KernelChannel, KernelLoss


class BoundaryClient:
    """The boundary's server in the kernel of ``channel``, and the comm its requests travel on. A fresh kernel gets a
    new one (its server is not installed yet)."""

    def __init__(self, channel: KernelChannel):
        self.channel = channel
        self.comm = ""  # the comm's id; "" until the server is installed in the current kernel

    @property
    def ready(self) -> bool:
        return bool(self.comm)

    def install(self, timeout_s: float) -> None:
        """Install the server, then open its comm (the kernel handles shell messages in order: later requests find it)."""
        call = f"_g['_efficient_ai_boundary_install']({boundary.MAX_ANSWER_BYTES}, {boundary.COMM_TARGET!r})"
        if not self.channel.install(boundary.KERNEL_SOURCE, "_efficient_ai_boundary", "<grading boundary>", call,
                                    timeout_s):
            return
        self.comm = secrets.token_hex(16)
        self.channel.send("comm_open", {"comm_id": self.comm, "target_name": boundary.COMM_TARGET, "data": {}})

    async def _ask(self, payload: str, timeout_s: float) -> tuple[str | None] | None:
        msg_id = self.channel.send("comm_msg", {"comm_id": self.comm, "data": {"request": payload}})

        def pick(message):
            if message["parent_header"].get("msg_id") != msg_id:
                return None
            content = message["content"]
            if message["msg_type"] == "comm_msg" and content.get("comm_id") == self.comm:
                data = content.get("data")
                answer = data.get("answer") if isinstance(data, dict) else None
                return (answer if isinstance(answer, str) else None,)
            if message["msg_type"] == "status" and content.get("execution_state") == "idle":
                return (None,)
            return None

        return await self.channel.read(pick, timeout_s, output=True, interrupt=True)

    def ask(self, payload: str, deadline: float = 0.0) -> str | None:
        """Send one request, interrupted at ``deadline`` (``time.monotonic()``; 0: ``KERNEL_REPLY_TIMEOUT_S`` from
        now); its answer text, or None if none came (a lost kernel, or student code replaced the server)."""
        if self.channel.lost or not self.ready:
            return None
        left_s = max(1.0, (deadline or time.monotonic() + KERNEL_REPLY_TIMEOUT_S) - time.monotonic())
        handled = self.channel.run(self._ask, payload, left_s)
        if handled is None:
            self.channel.lose(KernelLoss(died=False, detail=f"no reply in {left_s:.0f} s, nor after an interrupt"))
            return None
        return handled[0]
