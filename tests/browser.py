"""Headless Chromium (Debian's chromium + chromium-driver, driven by Selenium) and a JupyterLab server on loopback,
for tests/test_browser.py."""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from pg_server import free_port

from course.cli.nbgrader_run import nbgrader_env

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
CHROMEDRIVER_CANDIDATES = ("/usr/bin/chromedriver",)
# Chromium as root in a container, with no network: no sandbox, no GPU, nothing fetched in the background.
CHROMIUM_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--window-size=1280,1600")
SERVER_START_TIMEOUT_S = 120


def _first(paths) -> str | None:
    return next((p for p in paths if Path(p).exists()), None)


def missing_reason() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -r requirements.txt)"
    if not _first(CHROMIUM_CANDIDATES) or not _first(CHROMEDRIVER_CANDIDATES):
        return "Debian's chromium and chromium-driver are not installed (scripts/test.sh installs them as root)"
    return None


def require_browser() -> None:
    """Skip (or, under CI=1, fail) when Chromium or Selenium is missing."""
    reason = missing_reason()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"the browser tests must run in CI: {reason}")
    pytest.skip(reason)


def start_chromium(profile: Path):
    """A headless Chromium driven by chromedriver, with a fresh profile in ``profile``."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = _first(CHROMIUM_CANDIDATES)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    service = Service(executable_path=_first(CHROMEDRIVER_CANDIDATES))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(60)
    return driver


class JupyterServer:
    """``jupyter lab`` on 127.0.0.1 with a random token, serving ``root`` and reading ``root``'s nbgrader_config.py.

    The formgrader is nbgrader's server extension (enabled in the environment): ``/formgrader`` on this server.
    """

    def __init__(self, root: Path, state: Path):
        self.root = root
        self.state = state
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.process: subprocess.Popen | None = None
        self.log = state / "jupyter.log"

    def url(self, path: str) -> str:
        """A page of this server, for a browser that has logged in (``login``)."""
        return f"http://127.0.0.1:{self.port}{path}"

    def token_url(self, path: str) -> str:
        sep = "&" if "?" in path else "?"
        return f"{self.url(path)}{sep}token={self.token}"

    def login(self, driver) -> None:
        """Log ``driver`` in with the token through the login form, as a TA does: a session cookie, not a URL token."""
        driver.get(self.url("/login"))
        box = wait_for(driver, lambda d: d.find_elements("css selector", "input[type=password]"), what="the login form")[0]
        box.send_keys(self.token)
        box.submit()
        wait_for(driver, lambda d: "/login" not in d.current_url, what="the login to finish")

    def start(self) -> "JupyterServer":
        for name in ("config", "runtime", "data", "workspaces", "ipython"):
            (self.state / name).mkdir(parents=True, exist_ok=True)
        env = nbgrader_env({
            "JUPYTER_CONFIG_DIR": str(self.state / "config"), "JUPYTER_RUNTIME_DIR": str(self.state / "runtime"),
            "IPYTHONDIR": str(self.state / "ipython"), "MPLBACKEND": "Agg",
        })
        command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
                   f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
                   f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}",
                   f"--LabApp.workspaces_dir={self.state / 'workspaces'}",
                   *(["--allow-root"] if os.geteuid() == 0 else [])]
        with self.log.open("w") as log:
            self.process = subprocess.Popen(command, cwd=self.root, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.process.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.token_url("/api/status"), timeout=5) as reply:
                    if reply.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"jupyter lab did not answer in {SERVER_START_TIMEOUT_S} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=20)


def wait_for(driver, condition, timeout_s: float = 60, what: str = "the page"):
    """``condition(driver)`` once it is truthy; fails with ``what`` after ``timeout_s`` seconds."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout_s, poll_frequency=0.25).until(condition)
    except TimeoutException:
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what} at {driver.current_url}") from None


def cleanup_profile(profile: Path) -> None:
    shutil.rmtree(profile, ignore_errors=True)
