"""The grader's side of the grading guard (``guard_kernel.py``, docs/SECURITY.md): installs it in a fresh kernel and
sends its signed commands. An answer missing or wrongly signed breaks the guard for good (``broken``).
"""
from __future__ import annotations

import ast
import hashlib
import hmac
import json
import secrets

from ..common.paths import KERNEL_DIR
from .kernel_channel import KernelChannel

GUARD_SOURCE = KERNEL_DIR / "guard_kernel.py"
NOT_INSTALLED = "the grading guard could not be installed in the kernel"
STOPPED_ANSWERING = ("the grading guard stopped answering correctly (student code removed or replaced it); every "
                     "later test cell scores zero")


def guard_value(reply: dict | None) -> str | None:
    """The ``guard`` user expression's value in a kernel's reply, or None where it has none."""
    try:
        value = reply["content"]["user_expressions"]["guard"]
        if value.get("status") != "ok":
            return None
        return ast.literal_eval(value["data"]["text/plain"])
    except (KeyError, TypeError, ValueError, SyntaxError):
        return None


class GuardClient:
    """The guard in the kernel of ``channel``; ``enabled`` False makes every command find nothing. A fresh kernel gets
    a new one, given what ``broken`` the last one was: a guard student code broke stays broken for the notebook."""

    def __init__(self, channel: KernelChannel, enabled: bool = True, broken: str = ""):
        self.channel = channel
        self.enabled = enabled
        self.key: bytes | None = None  # None: not installed in this kernel yet (or no longer trusted)
        self.broken = broken  # why the guard's answers can no longer be trusted ("" while they can)

    def needs_install(self) -> bool:
        return self.enabled and self.key is None and not self.broken

    def install(self, watch_libraries: bool, timeout_s: float) -> None:
        """Install the guard and take its key; with ``watch_libraries`` it also imports and watches numpy, torch and
        utils."""
        key = None
        if self.channel.install(GUARD_SOURCE, "_efficient_ai_guard", "<grading guard>",
                                f"_efficient_ai_guard = _g['_efficient_ai_guard_install']({watch_libraries!r})",
                                timeout_s):
            key = guard_value(self.channel.request("", "_efficient_ai_guard('key')"))
        if key:
            self.key = bytes.fromhex(key)
        else:
            self.broken = NOT_INSTALLED

    def command(self, command: str) -> list[str]:
        """Run ``check``, ``restore``, ``mark`` or ``adopt``; the findings, or why the guard's answer is not trusted."""
        if not self.enabled:
            return []
        if self.key is None:
            return [self.broken]
        nonce = secrets.token_hex(16)
        value = guard_value(self.channel.request("", f"_efficient_ai_guard({command!r}, {nonce!r})"))
        if self.channel.lost:
            return []  # the kernel itself is gone or mute: execution stops there (GuardedExecute)
        payload, _, signature = (value or "").rpartition("|")
        expected = hmac.new(self.key, f"{nonce}|{payload}".encode(), hashlib.sha256).hexdigest()
        if not value or not hmac.compare_digest(signature, expected):
            self.key = None
            self.broken = STOPPED_ANSWERING
            return [self.broken]
        return json.loads(payload) if command in ("check", "restore") else []
