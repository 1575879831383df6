"""`mlflow server` on loopback with a SQLite store, for tests/e2e/test_mlflow.py and
benchmarks/tracker_overhead.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from runs import free_port


class Server:
    """`mlflow server` on 127.0.0.1 with a SQLite store, until stopped."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port",
             str(self.port), "--workers", "1", "--backend-store-uri",
             f"sqlite:///{folder / 'mlflow.db'}", "--default-artifact-root",
             str(folder / "artifacts")], stdout=subprocess.DEVNULL,
            stderr=open(folder / "server.log", "wb"), start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
            assert self.proc.poll() is None, (folder / "server.log").read_text()[-2000:]
        raise AssertionError("the MLflow server did not answer in 120 s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
