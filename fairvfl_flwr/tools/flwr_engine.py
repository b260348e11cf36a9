"""Drive the real Flower simulation runtime: a private SuperLink and `flwr run`.

Used by the tools' ``--engine flwr`` (tools/jobs.py) and the end-to-end tests. The SuperLink
gets its own ``FLWR_HOME``, port and in-memory database, and runtime dependency installation
is off (offline machines, CI).
`flwr run` exits 0 even when the ServerApp fails, so a run's status is read back with
`flwr ls` once its log stream has ended, and must be ``finished:completed``.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from fairvfl_flwr.tools.cli import config_text

APP_DIR = Path(__file__).resolve().parents[2]  # the folder holding pyproject.toml (the Flower app)
BIN = Path(sys.executable).parent
SIMULATION_HINT = 'pip install -e ".[simulation]"'


class FlwrRunError(RuntimeError):
    """The SuperLink could not start, or a run did not finish as completed."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In a child process: SIGTERM once the process that started it dies (Linux's
    PR_SET_PDEATHSIG), so that a run killed outright leaves no Ray head behind."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: stop() alone ends the head
        pass


class PrivateRay:
    """A Ray head of its own (``ray start --head --block``) for many `flwr run`s to share.

    Each `flwr run` in the simulation engine otherwise starts a Ray instance and stops it at the
    end: about 20 s of a loaded 2-core machine before round 1. Flower's Ray backend connects to
    the cluster that ``RAY_ADDRESS`` names instead (``ray.init``); each run still makes and ends
    its own actors, in worker processes of its own job. The head's session files are in a
    private temporary folder, so a ``ray.init()`` elsewhere on the machine never finds it, and
    it listens on ports that were free, so it does not meet another Ray of the machine. The
    head starts in the background: :meth:`wait` returns its address once it is up.
    """

    def __init__(self, env: dict | None = None) -> None:
        env = env or {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        self.folder = Path(tempfile.mkdtemp(prefix="fvray"))  # short: Ray's socket paths have a limit
        ports = {opt: str(_free_port()) for opt in ("--port", "--ray-client-server-port",
                                                      "--dashboard-port", "--dashboard-agent-listen-port")}
        self.log = open(self.folder / "ray-start.log", "w")
        self.proc = subprocess.Popen(
            [str(BIN / "ray"), "start", "--head", "--block", "--temp-dir", str(self.folder),
             "--node-ip-address", "127.0.0.1", "--include-dashboard=false", "--disable-usage-stats",
             *[x for opt, port in ports.items() for x in (opt, port)]],
            env=env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() ends whatever the head left behind
            preexec_fn=_die_with_parent,
        )
        self.address = ""

    def wait(self, timeout: float = 120) -> str:
        """The head's address once it is up (FlwrRunError with its log if it is not within ``timeout``)."""
        ready = self.folder / "ray_current_cluster"  # the head's address, written before it blocks
        deadline = time.monotonic() + timeout
        while not self.address:
            if ready.exists() and (text := ready.read_text().strip()):
                self.address = text
            elif self.proc.poll() is not None or time.monotonic() > deadline:
                log = (self.folder / "ray-start.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise FlwrRunError(f"ray start --head did not come up within {timeout:.0f} s: {log}")
            else:
                time.sleep(0.3)
        return self.address

    def stop(self) -> None:
        """Stop the head: SIGTERM (it ends its own processes), then SIGKILL to its process group."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class SimulationSuperLink:
    """A ``flower-superlink --simulation`` with its own FLWR_HOME and port (context manager).

    ``shared_ray``: every run connects to one :class:`PrivateRay` (this one, or one started here
    when True) instead of starting Ray of its own: for many runs whose end-to-end time is not
    what is measured. The SuperLink stops it with itself.
    """

    def __init__(self, home: Path, app_dir: Path = APP_DIR, shared_ray: bool | PrivateRay = False) -> None:
        if not (Path(app_dir) / "pyproject.toml").exists():
            raise FlwrRunError(f"--engine flwr needs the app's source folder (pyproject.toml); not found in {app_dir}")
        if not (BIN / "flower-superlink").exists():
            raise FlwrRunError(f"flower-superlink not found next to {sys.executable}; install flwr")
        if importlib.util.find_spec("ray") is None:  # the SuperLink would start, and every run fail
            raise FlwrRunError(f"Flower's simulation engine needs Ray: {SIMULATION_HINT}")
        self.app_dir = Path(app_dir)
        self.home = Path(home)
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "cmp"\n\n[superlink.cmp]\naddress = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )
        self.env = {
            **os.environ,
            "FLWR_HOME": str(self.home),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        }
        self.ray = shared_ray if isinstance(shared_ray, PrivateRay) else PrivateRay(self.env) if shared_ray else None
        if self.ray is not None:
            try:
                self.env["RAY_ADDRESS"] = self.ray.wait()
            except FlwrRunError as e:  # Ray's own 30 s for its node to register, on a loaded machine
                warnings.warn(f"each run starts Ray of its own: the shared head did not start ({e})", stacklevel=2)
                self.ray = None
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
                self.stop()
                raise FlwrRunError(f"flower-superlink exited: {(self.home / 'superlink.log').read_text()[-2000:]}")
            time.sleep(0.3)
        self.stop()
        raise FlwrRunError("flower-superlink did not open its port within 60 s")

    def __enter__(self) -> "SimulationSuperLink":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def flwr(self, *args: str, timeout: float = 120) -> str:
        """Run the ``flwr`` CLI against this SuperLink (its FLWR_HOME, from the app's folder); its
        stdout, or FlwrRunError with both streams."""
        out = subprocess.run([str(BIN / "flwr"), *args], env=self.env, cwd=self.app_dir,
                             capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise FlwrRunError(f"flwr {' '.join(args)} failed: {out.stdout}\n{out.stderr}")
        return out.stdout

    def run(self, run_config: dict, num_supernodes: int, timeout: float = 3600) -> str:
        """Submit ``flwr run .``, wait until it ends; return the run id (raises unless completed)."""
        res = json.loads(self.flwr("run", ".", "cmp", "--run-config", config_text(run_config),
                                   "--federation-config", f"num-supernodes={num_supernodes}", "--format", "json"))
        if not res.get("success"):
            raise FlwrRunError(f"flwr run refused the run: {res}")
        run_id = str(res["run-id"])
        # One `flwr log --stream`, which the SuperLink ends when the run finishes, instead of
        # polling `flwr ls`: each CLI call costs a second or two of CPU, taken from the run itself.
        try:
            log = self.flwr("log", run_id, "cmp", "--stream", timeout=timeout)
        except subprocess.TimeoutExpired:
            raise FlwrRunError(f"run {run_id} did not finish within {timeout:.0f} s") from None
        deadline = time.monotonic() + 60  # a stream cut short: the status says whether the run ended
        while (status := self._status(run_id)) and not status.startswith("finished"):
            if time.monotonic() > deadline:
                raise FlwrRunError(f"run {run_id} is {status} after its log stream ended:\n{log[-3000:]}")
            time.sleep(1)
        if status != "finished:completed":
            raise FlwrRunError(f"run {run_id} ended {status}:\n{log[-3000:]}")
        return run_id

    def _status(self, run_id: str) -> str:
        return json.loads(self.flwr("ls", "cmp", "--run-id", run_id, "--format", "json"))["runs"][0]["status"]

    def stop(self) -> None:
        """Stop the SuperLink (terminate, then kill after 20 s), close its log, stop its Ray head."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        if self.ray is not None:
            self.ray.stop()
