"""The fake engine (tests/fake_engine.py) as the launcher's tests use it: its command, the fixture that
checks by PID that none of its processes outlives a test, and a small evaluate run against it."""

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from specwise.bench.config import EvaluateConfig
from specwise.bench.launch.pool import LaunchSettings

ROOT = Path(__file__).resolve().parents[1]
FAKE = f"{sys.executable} {ROOT / 'tests' / 'fake_engine.py'} serve"
DEADLINE = 60.0     # seconds: generous bounds for polls, never an assertion about speed


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


def pids(pid_dir: Path) -> list[int]:
    return [int(path.stem) for path in pid_dir.glob("*.pid")]


def wait_for(condition, what: str):
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {DEADLINE:g} s")
        time.sleep(0.05)


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """The fake engine's environment; after the test, none of its processes may be alive."""
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    monkeypatch.setenv("FAKE_ENGINE_PID_DIR", str(pid_dir))
    monkeypatch.setenv("FAKE_ENGINE_CHILD", "1")
    monkeypatch.setenv("FAKE_ENGINE_START_DELAY", "0.3")
    yield pid_dir
    left = [pid for pid in pids(pid_dir) if alive(pid)]
    for pid in left:                    # never leave them, even when the test failed
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left running: {left}"


def run_config(tmp_path, **overrides) -> EvaluateConfig:
    values = dict(methods="off,ngram@4", concurrency="1,2", num_requests=4, max_tokens=8, per_category=1,
                  warmup=1, progress=False, settle=0.0, output=str(tmp_path / "results"))
    values.update(overrides)
    return EvaluateConfig(**values)


def settings(**overrides) -> LaunchSettings:
    values = dict(engine="vllm", model="/models/hf", engine_cmd=FAKE, start_timeout=DEADLINE)
    values.update(overrides)
    return LaunchSettings(**values)
