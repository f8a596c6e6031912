"""A throw-away PostgreSQL server on loopback for tests (Debian's postgresql package)."""
from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def find_pg_bin() -> Path | None:
    """Folder of initdb/pg_ctl (Debian puts them in /usr/lib/postgresql/<version>/bin), or None."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    if candidates:
        return Path(candidates[0]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PostgresServer:
    """initdb + pg_ctl start in a temporary folder, listening on 127.0.0.1 only, trust authentication.

    As root, the server runs as the ``postgres`` system user (PostgreSQL refuses to run as root).
    """

    def __init__(self, bin_dir: Path):
        self.bin_dir = bin_dir
        self.dir = Path(tempfile.mkdtemp(prefix="pg-test-"))
        self.port = free_port()
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *args: str) -> None:
        subprocess.run([*self.as_user, *args], check=True, capture_output=True, text=True, timeout=120)

    def start(self) -> "PostgresServer":
        if self.as_user:
            shutil.chown(self.dir, "postgres")
            os.chmod(self.dir, 0o700)
        data = self.dir / "data"
        self._run(str(self.bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres")
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(data), "-l", str(self.dir / "log"), "-w", "-o",
                  f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1", "start")
        return self

    def create_database(self, name: str) -> str:
        """Create a database; return its SQLAlchemy URL."""
        self._run(str(self.bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name)
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        subprocess.run([*self.as_user, str(self.bin_dir / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "fast", "stop"],
                       capture_output=True, timeout=120)
        shutil.rmtree(self.dir, ignore_errors=True)
