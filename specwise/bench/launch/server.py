"""One launched server's life: start, wait until it serves, notice it exit, stop it for sure.

Start: the command runs in its own session (start_new_session: its pid is its process
group, which holds whatever the engine forks: vLLM's engine core, SGLang's schedulers),
stdout and stderr appended to its log in the results directory.
Ready: GET /health answers 200 (vLLM, SGLang, specwise), else GET /v1/models does.
A server that exits first was refused by the engine (a flag it rejects, a model it cannot
load): LaunchError with the engine's own message, read from the end of its log. One that
is not ready by the start timeout is stopped, and the error ends with its log's last lines.
Stop: SIGTERM to the group, up to STOP_GRACE seconds for every member to leave, then
SIGKILL to the group; the leader is reaped. A Ctrl-C (or SIGTERM) during stop_all() skips
the grace (SIGKILL at once) instead of leaving the rest running.
Every started server is in LIVE until stopped; stop_all() runs at exit too (atexit).
"""

import asyncio
import atexit
import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx

from specwise.bench.launch.command import ServerCommand
from specwise.errors import SpecwiseError

STOP_GRACE = 15.0       # seconds for a server to leave after SIGTERM (vLLM for CPU: ~2-5 s)
POLL = 0.2              # seconds between readiness probes
TAIL_LINES = 3          # log lines in a one-line error
LIVE: set["LaunchedServer"] = set()
_HURRY = threading.Event()      # set by a Ctrl-C during stop_all(): SIGKILL without grace


class LaunchError(SpecwiseError):
    """A server that would not start; the message is one line and names the log."""


class LaunchedServer:
    def __init__(self, command: ServerCommand, log_path: Path):
        self.command, self.log_path = command, Path(log_path)
        self.process: subprocess.Popen | None = None
        self.starts = 0

    @property
    def name(self) -> str:
        return self.command.arm

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== specwise start {self.starts} at {time.strftime('%H:%M:%S')}: "
                      f"{self.command.text()}\n".encode())
            log.flush()
            try:
                self.process = subprocess.Popen(self.command.argv, stdin=subprocess.DEVNULL, stdout=log,
                                                stderr=subprocess.STDOUT, env={**os.environ, **self.command.env},
                                                start_new_session=True)
            except OSError as error:
                raise LaunchError(f"arm {self.name}: cannot run {self.command.argv[0]!r} ({error.strerror}); "
                                  "set --engine-cmd to the engine's command") from None
        LIVE.add(self)

    def exit_code(self) -> int | None:
        """The server's exit status once it has exited, else None."""
        return None if self.process is None else self.process.poll()

    async def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=5.0) as client:
            while True:
                code = self.exit_code()
                if code is not None:
                    raise LaunchError(f"arm {self.name}: the server exited during start-up (exit code {code}): "
                                      f"{self.engine_message()} (log: {self.log_path})")
                if await _answers(client, self.command.url):
                    return
                if time.monotonic() > deadline:
                    self.stop()
                    raise LaunchError(f"arm {self.name}: the server was not ready after {timeout:g} s "
                                      f"(--start-timeout), stopped; last lines of {self.log_path}: "
                                      f"{' | '.join(self.log_tail())}")
                await asyncio.sleep(POLL)

    def start_and_wait(self, timeout: float) -> None:
        """start() and wait_ready() for a caller outside an event loop (a benchmark's, a test's); a server
        that does not come up, or a Ctrl-C meanwhile, is stopped before the error goes on."""
        self.start()
        try:
            asyncio.run(self.wait_ready(timeout))
        except BaseException:
            self.stop()
            raise

    def log_tail(self, lines: int = TAIL_LINES) -> list[str]:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return []
        kept = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("=== specwise")]
        return [_short(line) for line in kept[-lines:]]

    def engine_message(self) -> str:
        """The engine's own complaint: the first exception it raised (the root cause: vLLM's worker raises
        "ValueError: Available memory ...", then its engine "RuntimeError: Engine core initialization failed.
        See root cause above."), else the last log line that names an error, else the last lines."""
        return engine_message(self.log_tail(200))

    def stop(self, grace: float = STOP_GRACE) -> int | None:
        """SIGTERM to the group, up to `grace` seconds for it to leave, then SIGKILL to whatever is left;
        reaps the leader and returns its exit status (None: it was not running). Idempotent."""
        process = self.process
        if process is None:
            return None
        group = process.pid
        _signal_group(group, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while not _HURRY.is_set() and time.monotonic() < deadline:
            if process.poll() is not None and not _group_alive(group):
                break
            time.sleep(0.05)
        _signal_group(group, signal.SIGKILL)
        status = process.wait()
        deadline = time.monotonic() + 5.0
        while _group_alive(group) and time.monotonic() < deadline:    # members not our children: init reaps
            time.sleep(0.05)
        self.process = None
        LIVE.discard(self)
        return status


def stop_all() -> None:
    """Stop every live server; a Ctrl-C or SIGTERM meanwhile makes it hurry, never abandon."""
    if not LIVE:
        return
    with _hurry_on_signals():
        for server in list(LIVE):
            server.stop()


@contextlib.contextmanager
def interrupt_on_sigterm():
    """While launched servers run: SIGTERM to us acts as Ctrl-C (it raises SIGINT, which
    asyncio.run turns into a cancelled run and then KeyboardInterrupt), so every finally and
    stop_all run. Main thread only (signal handlers live there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        signal.raise_signal(signal.SIGINT)

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _hurry_on_signals():
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _HURRY.clear()
    handlers = {signum: signal.signal(signum, lambda *_: _HURRY.set()) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        _HURRY.clear()


async def engine_version(url: str) -> str | None:
    """The engine's own version: GET /version (vLLM, specwise), else /get_server_info (SGLang)."""
    async with httpx.AsyncClient(timeout=5.0) as client:
        for path in ("/version", "/get_server_info"):
            try:
                response = await client.get(url + path)
                if response.status_code == 200:
                    version = response.json().get("version")
                    if version:
                        return str(version)
            except (httpx.HTTPError, ValueError, AttributeError):
                continue
    return None


async def _answers(client: httpx.AsyncClient, url: str) -> bool:
    for path in ("/health", "/v1/models"):
        try:
            response = await client.get(url + path)
        except httpx.HTTPError:
            return False
        if response.status_code == 200:
            return True
        if response.status_code != 404:     # starting (503): ask again later
            return False
    return False


def _signal_group(group: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signum)


def _group_alive(group: int) -> bool:
    """Whether any process of the group still runs (zombies left to init do not count)."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return bool(group_members(group)) if os.path.isdir("/proc/self") else True


def group_members(group: int) -> list[int]:
    """Pids of the group's processes that are not zombies (Linux: read from /proc)."""
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()
            if (fields := _stat(int(entry))) and len(fields) > 2 and fields[2] == str(group) and _running(fields)]


def process_alive(pid: int) -> bool:
    """Whether pid runs (a zombie does not; Linux: read from /proc)."""
    fields = _stat(pid)
    return bool(fields) and _running(fields)


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat after "pid (comm)": state, ppid, pgrp, ...; None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as file:
            return file.read().rpartition(")")[2].split()
    except OSError:
        return None


def _running(fields: list[str]) -> bool:
    return fields[0] not in ("Z", "X")


def engine_message(lines: list[str]) -> str:
    """See LaunchedServer.engine_message: lines are the log's last ones, oldest first."""
    raised = [match.group(1) for line in lines if (match := _RAISED.search(line))]
    if raised:
        return raised[0]
    errors = [line for line in lines if "error" in line.lower() or "invalid" in line.lower()]
    return errors[-1] if errors else " | ".join(lines[-TAIL_LINES:]) or "(its log is empty)"


# "ValueError: ..." opening a line or its message after a log prefix ("... [core.py:1510] ValueError: ..."),
# not one quoted inside a message (vLLM's warning "can cause fd limit errors like `OSError: [Errno 24] ...`")
_RAISED = re.compile(r"(?:^|\] )([A-Z]\w*(?:Error|Exception): .+)")


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


atexit.register(stop_all)
