"""`specwise evaluate --engine` interrupted at random moments: is any launched process left?

    python benchmarks/launcher_interrupts.py              # 20 runs, seed 0
    python benchmarks/launcher_interrupts.py --runs 40 --seed 3

Each run launches the fake engine (tests/fake_engine.py, which forks a helper child into its
process group, as vLLM forks its engine core) for two arms, side by side or in blocks, and is
then, at a random moment (0.3-8 s after its first server was launched: start-up, warm-up or
measuring), sent
SIGINT, SIGTERM, SIGINT twice (the second while servers are being stopped, to servers that
ignore SIGTERM), or left alone with a server that crashes mid-run. Printed: per run the
action, the moment, the exit status and the processes left alive (by PID); then the totals.
"""

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specwise.bench.launch.server import process_alive

ROOT = Path(__file__).resolve().parents[1]
FAKE = f"{sys.executable} {ROOT / 'tests' / 'fake_engine.py'} serve"
ACTIONS = ("SIGINT", "SIGTERM", "SIGINT twice", "crash")


def one_run(index: int, rng: random.Random, work: Path) -> tuple[str, float, int, list[int], bool]:
    action, moment = rng.choice(ACTIONS), rng.uniform(0.3, 8.0)     # seconds after the first launch
    pairing = rng.choice(("side-by-side", "blocks"))
    pid_dir = work / f"pids{index}"
    pid_dir.mkdir()
    env = dict(os.environ, FAKE_ENGINE_PID_DIR=str(pid_dir), FAKE_ENGINE_CHILD="1",
               FAKE_ENGINE_START_DELAY=f"{rng.uniform(0.2, 2.0):.2f}", FAKE_ENGINE_STEP_DELAY="0.02")
    if action == "crash":
        env.update(FAKE_ENGINE_CRASH_AFTER=str(rng.randint(2, 6)))
    if action == "SIGINT twice":
        env.update(FAKE_ENGINE_IGNORE_TERM="1")
    command = [sys.executable, "-m", "specwise", "evaluate", "--engine", "vllm", "--engine-cmd", FAKE,
               "--model", "/models/hf", "--methods", "off,ngram@4", "--concurrency", "1,2", "--num-requests", "8",
               "--max-tokens", "24", "--per-category", "1", "--pairing", pairing, "--no-progress",
               "--settle", "0", "--output", str(work / f"results{index}")]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    deadline = time.monotonic() + 120
    while not list(pid_dir.glob("*.pid")) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)                # the moment counts from the first server's launch
    if action != "crash":
        try:
            process.wait(timeout=moment)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM if action == "SIGTERM" else signal.SIGINT)
            if action == "SIGINT twice":
                time.sleep(0.5)
                if process.poll() is None:
                    process.send_signal(signal.SIGINT)
    try:
        _, stderr = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        process.kill()
        _, stderr = process.communicate()
    left = [int(path.stem) for path in pid_dir.glob("*.pid") if process_alive(int(path.stem))]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    traceback = stderr.strip().splitlines()[-1] if "Traceback" in stderr else ""
    return f"{action} ({pairing})", moment, process.returncode, left, traceback


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    left_total, tracebacks = 0, 0
    with tempfile.TemporaryDirectory() as folder:
        for index in range(args.runs):
            action, moment, code, left, traceback = one_run(index, rng, Path(folder))
            left_total += len(left)
            tracebacks += bool(traceback)
            print(f"{index + 1:>3}  {action:<28} at {moment:4.1f} s  exit {code:>3}  left alive: "
                  f"{left or 'none'}{'  TRACEBACK: ' + traceback if traceback else ''}", flush=True)
    print(f"{args.runs} runs: {left_total} launched process(es) left alive, {tracebacks} traceback(s)")


if __name__ == "__main__":
    main()
