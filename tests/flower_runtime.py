"""Start a private simulation SuperLink and submit runs to it with the real `flwr` CLI.

`flwr run` exits 0 even when the ServerApp fails, so the run's status is read back with
`flwr ls` and must be `finished:completed`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SimulationSuperLink:
    """A `flower-superlink --simulation` with its own FLWR_HOME and port."""

    def __init__(self, home: Path) -> None:
        self.home = Path(home)
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "test"\n\n[superlink.test]\naddress = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )
        self.env = {
            **os.environ,
            "FLWR_HOME": str(self.home),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        }
        self.log = open(self.home / "superlink.log", "w")
        self.proc = subprocess.Popen(
            [str(BIN / "flower-superlink"), "--insecure", "--simulation", "--isolation", "subprocess",
             "--host", "127.0.0.1", "--port", str(self.port), "--database", ":flwr-in-memory:",
             "--disable-runtime-dependency-installation"],
            env=self.env, stdout=self.log, stderr=subprocess.STDOUT, cwd=self.home,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            if self.proc.poll() is not None:
                raise RuntimeError(f"flower-superlink exited: {(self.home / 'superlink.log').read_text()[-2000:]}")
            time.sleep(0.3)
        raise RuntimeError("flower-superlink did not open its port within 60 s")

    def flwr(self, *args: str, timeout: float = 120) -> str:
        out = subprocess.run(
            [str(BIN / "flwr"), *args], env=self.env, cwd=REPO, capture_output=True, text=True, timeout=timeout
        )
        if out.returncode != 0:
            raise RuntimeError(f"flwr {' '.join(args)} failed: {out.stdout}\n{out.stderr}")
        return out.stdout

    def run(self, run_config: str, num_supernodes: int = 6, timeout: float = 600) -> tuple[str, str]:
        """Submit `flwr run .`, wait for it to end; return (run id, final status)."""
        res = json.loads(self.flwr("run", ".", "test", "--run-config", run_config, "--federation-config",
                                   f"num-supernodes={num_supernodes}", "--format", "json"))
        if not res.get("success"):
            raise RuntimeError(f"flwr run refused the run: {res}")
        run_id = str(res["run-id"])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            runs = json.loads(self.flwr("ls", "test", "--run-id", run_id, "--format", "json"))["runs"]
            status = runs[0]["status"]
            if status.startswith("finished"):
                return run_id, status
            time.sleep(2)
        raise TimeoutError(f"run {run_id} did not finish within {timeout} s")

    def logs(self, run_id: str) -> str:
        return self.flwr("log", run_id, "test", "--show")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
