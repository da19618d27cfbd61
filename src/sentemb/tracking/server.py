"""A real ``mlflow server`` on 127.0.0.1, started and stopped by PID (tests, the fault matrix).

The server runs in its own process group (``mlflow server`` starts uvicorn workers as children):
``kill`` sends SIGKILL to that group, as a login node's OOM killer or an admin would; ``stop``
sends SIGTERM first. Nothing is matched by name.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """``mlflow server`` with a SQLite store and served artifacts under ``root``, one worker."""

    def __init__(self, root: str | os.PathLike, port: int | None = None, *, app_name: str | None = None,
                 env: dict | None = None):
        self.root, self.port, self.app_name = Path(root), port or free_port(), app_name
        self.env = env or {}
        self.proc: subprocess.Popen | None = None
        self.uri = f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180) -> "MlflowServer":
        return self.launch().ready(timeout)

    def launch(self) -> "MlflowServer":
        """Start the process and return at once (``ready`` waits for it to answer)."""
        self.root.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
               "--artifacts-destination", str(self.root / "mlartifacts"), "--host", "127.0.0.1",
               "--port", str(self.port), "--workers", "1"]
        if self.app_name:
            cmd += ["--app-name", self.app_name]
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true",
               **self.env}
        env.pop("MLFLOW_TRACKING_URI", None)
        with open(self.root / "server.log", "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.root,
                                         start_new_session=True)
        return self

    def ready(self, timeout: float = 180) -> "MlflowServer":
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self.proc.returncode}: "
                                   f"{(self.root / 'server.log').read_text(errors='replace')[-3000:]}")
            try:
                urllib.request.urlopen(f"{self.uri}/health", timeout=2)
                return self
            except urllib.error.HTTPError:  # it answers (basic-auth: 401)
                return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"mlflow server on port {self.port} not up after {timeout} s")

    def kill(self) -> None:
        """SIGKILL to the server's process group: no clean-up runs."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        self._signal(signal.SIGTERM, wait=10)
        self._signal(signal.SIGKILL)

    def _signal(self, sig, wait: float = 30) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)  # the group's id is the server's PID (start_new_session)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(wait)
        except subprocess.TimeoutExpired:
            return
        self.proc = None

    def __enter__(self) -> "MlflowServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
