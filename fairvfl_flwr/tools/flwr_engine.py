"""Drive the real Flower simulation runtime: a private SuperLink and `flwr run`.

Used by the tools' ``--engine flwr`` (tools/tasks.py) and the end-to-end tests. The SuperLink
gets its own ``FLWR_HOME``, port and in-memory database, and runtime dependency installation
is off (offline machines, CI).
`flwr run` exits 0 even when the ServerApp fails, so a run's status is read back from the
SuperLink's Control API (:class:`RunStatus`, the ``flwr ls`` CLI where that fails), and
must be ``finished:completed``.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fairvfl_flwr.tools.appsource import submittable
from fairvfl_flwr.tools.cli import config_text

APP_DIR = Path(__file__).resolve().parents[2]  # the folder holding pyproject.toml (the Flower app)
BIN = Path(sys.executable).parent
SIMULATION_HINT = 'pip install -e ".[simulation]"'
WAIT_POLL = 0.5  # seconds between two status checks of a run
WAIT_POLL_CLI_MAX = 8.0  # ... at most, when each check has to start the flwr CLI


class FlwrRunError(RuntimeError):
    """The SuperLink could not start, or a run did not finish as completed."""


class RunStatus:
    """A run's status (``running``, ``finished:completed``, ...) asked of a SuperLink's Control
    API from this process, or None where that call fails (a Flower whose client differs: ask the
    ``flwr ls`` CLI, which says what is wrong). A ``flwr ls`` is a fresh interpreter, about 2.5
    CPU-seconds taken from the run it waits for; this call costs next to nothing."""

    def __init__(self, address: str, root_certificates: bytes | None = None) -> None:
        self.address, self.root_certificates = address, root_certificates
        self._client: Any = None  # made on first use

    def __call__(self, run_id: str) -> str | None:
        try:
            from flwr.proto.control_pb2 import ListRunsRequest  # noqa: PLC0415 (harness only)
            from flwr.supercore.control import ControlHttpClient  # noqa: PLC0415

            if self._client is None:
                self._client = ControlHttpClient.from_server_address(
                    server_address=self.address, insecure=self.root_certificates is None,
                    root_certificates=self.root_certificates, interceptors=[])
            run = self._client.ListRuns(ListRunsRequest(run_id=int(run_id))).run_dict[int(run_id)]
        except Exception:  # noqa: BLE001 (any failure: the caller asks the CLI)
            self._client = None
            return None
        return f"{run.status.status}:{run.status.sub_status}" if run.status.sub_status else run.status.status


def wait_finished(status: Callable[[str], tuple[str, bool]], run_id: str, timeout: float) -> str:
    """Poll ``status(run_id)`` (the status, and whether it was cheap to ask: the Control API)
    until the run has finished; return its status (TimeoutError after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    pause = WAIT_POLL
    while time.monotonic() < deadline:
        now, cheap = status(run_id)
        if now.startswith("finished"):
            return now
        time.sleep(pause)
        # through the CLI each check is an interpreter: back off so as not to load the runtime
        pause = WAIT_POLL if cheap else min(2 * pause, WAIT_POLL_CLI_MAX)
    raise TimeoutError(f"run {run_id} did not finish within {timeout:.0f} s")


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
        self._control = RunStatus(f"127.0.0.1:{self.port}")
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
        """Submit ``flwr run`` (the app folder's source: tools/appsource.py), wait until it ends;
        return the run id (raises unless completed, with the tail of the run's log)."""
        with submittable(self.app_dir) as source:
            res = json.loads(self.flwr("run", str(source), "cmp", "--run-config", config_text(run_config),
                                       "--federation-config", f"num-supernodes={num_supernodes}", "--format", "json"))
        if not res.get("success"):
            raise FlwrRunError(f"flwr run refused the run: {res}")
        run_id = str(res["run-id"])
        # the status from the Control API: the only CLI call besides `flwr run` is the log of a failed run
        try:
            status = wait_finished(self.status, run_id, timeout)
        except TimeoutError:
            raise FlwrRunError(f"run {run_id} did not finish within {timeout:.0f} s:\n{self.run_log(run_id)[-3000:]}") \
                from None
        if status != "finished:completed":
            raise FlwrRunError(f"run {run_id} ended {status}:\n{self.run_log(run_id)[-3000:]}")
        return run_id

    def status(self, run_id: str) -> tuple[str, bool]:
        """The run's status, and whether it came from the Control API (True) or the CLI (False)."""
        if (status := self._control(run_id)) is not None:
            return status, True
        return json.loads(self.flwr("ls", "cmp", "--run-id", run_id, "--format", "json"))["runs"][0]["status"], False

    def run_log(self, run_id: str) -> str:
        """The run's log so far (``flwr log --show``)."""
        return self.flwr("log", run_id, "cmp", "--show")

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
