"""The servers of one `specwise evaluate --engine` run, one per arm, and the arms they serve.

Pairing, chosen and stated (run.json "launch", the report):
  side-by-side  every arm's server is up for the whole run, each on its own cores (--cores,
                taskset) or GPUs (--devices, CUDA_VISIBLE_DEVICES) when given; rounds
                interleave as with any endpoints (bench/load/schedule.py).
  blocks        one server up at a time (one GPU, or a machine too small for two): at each
                change of arm the running server is stopped and the next one started, then
                warmed up (the runner's warm-up requests, excluded from figures); a fresh
                start also starts with empty caches. The schedule's rounds become blocks:
                A | B B | A A | B ... Restarts are counted.
vLLM for CPU side by side: each server gets a share of the memory for its KV cache unless the
user chose one (launch/memory.py; run.json "launch" "kv_cache" and the report say so).
Per-request acceptance: vLLM arms are launched with --per-request-spec-decode-metrics, SGLang arms'
requests ask for it (return_spec_tokens_details, SGLang 0.5.23); an SGLang without it returns none
and acceptance comes from its Prometheus gauges per load point.
An engine that refuses per-request acceptance (vLLM before 0.32) is relaunched without it:
acceptance then comes from its Prometheus counters (in blocks read around each block and summed:
bench/load/runner.py), and the report says so.
A server that exits mid-run ends its requests as errors ("server of arm X exited (code N)")
and the run goes on (--on-server-exit continue; in blocks the next block restarts it) or
stops with what finished kept (--on-server-exit stop).
"""

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator

from specwise.bench.engine_flags import vllm_limits
from specwise.bench.inputs.request import WorkloadRequest
from specwise.bench.launch.command import (PER_REQUEST_METRICS, ServerCommand, build_command, check_cores, free_port,
                                           split_sets)
from specwise.bench.launch.memory import kv_cache_share
from specwise.bench.launch.server import LaunchError, LaunchedServer, engine_version
from specwise.bench.load.arms import ArmSpec
from specwise.bench.load.targets.base import ServerAcceptance, StreamEvent, TargetError
from specwise.bench.load.targets.http import HttpTarget, announced
from specwise.bench.load.targets.per_request import SGLANG_REQUEST
from specwise.errors import SpecwiseError

PAIRINGS = ("auto", "side-by-side", "blocks")
ON_EXIT = ("continue", "stop")
EXIT_WAIT = 1.0     # seconds to see a failed request's server exit (its socket closes first)


class ServerExited(SpecwiseError):
    """--on-server-exit stop: an arm's server exited mid-run."""


@dataclass
class LaunchSettings:
    engine: str
    model: str
    engine_cmd: str | None = None
    engine_args: str | None = None
    cores: str | None = None            # one core list per arm, '/'-separated
    devices: str | None = None          # one device list per arm, '/'-separated
    pairing: str = "auto"
    start_timeout: float = 900.0
    on_server_exit: str = "continue"
    per_request_metrics: bool = True
    blocks: int = 4                     # blocks per load point when paired in blocks
    dry_run: bool = False
    k: int = 4                          # draft tokens for a method given without @k

    def resolved_pairing(self, arms: int) -> str:
        if self.pairing != "auto":
            return self.pairing
        return "side-by-side" if self.cores or self.devices or arms == 1 else "blocks"


class ServerPool:
    def __init__(self, settings: LaunchSettings, specs: list[ArmSpec], results_dir: Path):
        self.settings, self.specs = settings, specs
        self.pairing = settings.resolved_pairing(len(specs))
        cores = split_sets(settings.cores, len(specs), "--cores")
        devices = split_sets(settings.devices, len(specs), "--devices")
        check_cores(cores)
        env, self.kv_note = {}, None
        if settings.engine == "vllm" and self.side_by_side and settings.devices is None:
            env, self.kv_note = kv_cache_share(len(specs), settings.engine_cmd, settings.engine_args)
        self.commands: dict[str, ServerCommand] = {
            spec.name: build_command(settings.engine, settings.engine_cmd, settings.model, spec, free_port(),
                                     settings.engine_args, core, device, settings.per_request_metrics, env)
            for spec, core, device in zip(specs, cores, devices)}
        self.servers = {name: LaunchedServer(command, Path(results_dir) / "servers" / f"{name}.log")
                        for name, command in self.commands.items()}
        self.current: str | None = None     # blocks: the arm whose server is up
        self.said: dict[str, dict] = {}     # arm -> its server's limits, as it said them once up (run.json "said")
        self.info = {"engine": settings.engine, "model": settings.model, "pairing": self.pairing,
                     "restarts": 0, "kv_cache": self.kv_note, "servers": [
                         {"arm": name, "command": command.text(), "argv": command.argv, "env": command.env,
                          "url": command.url, "log": str(self.servers[name].log_path), "version": None,
                          "starts": 0, "exits": []}
                         for name, command in self.commands.items()]}

    @property
    def side_by_side(self) -> bool:
        return self.pairing == "side-by-side"

    def entry(self, name: str) -> dict:
        return next(entry for entry in self.info["servers"] if entry["arm"] == name)

    async def ensure_up(self, name: str) -> bool:
        """Start `name`'s server unless it runs (in blocks, stopping the other first); True if started."""
        server = self.servers[name]
        if server.process is not None and server.exit_code() is None:
            return False
        if server.process is not None:          # exited: reap what is left before a restart
            server.stop()
        if not self.side_by_side and self.current not in (None, name):
            self.servers[self.current].stop()
        entry = self.entry(name)
        try:
            await self._start(server, entry)
        except LaunchError as error:
            if PER_REQUEST_METRICS[0] not in server.command.argv or PER_REQUEST_METRICS[0] not in str(error):
                raise
            self._without_per_request_metrics(name, str(error))     # an engine older than vLLM 0.32
            server = self.servers[name]
            await self._start(server, entry)
        self.current = name
        if entry["version"] is None:
            entry["version"] = await engine_version(server.command.url)
        if name not in self.said:       # what it says of itself, else what its command line set
            command = vllm_limits(server.command.argv) if self.settings.engine == "vllm" else {}
            self.said[name] = command | (await announced(server.command.url)).limits()
        return True

    async def _start(self, server: LaunchedServer, entry: dict) -> None:
        server.start()
        entry["starts"] = server.starts
        self.info["restarts"] = sum(e["starts"] for e in self.info["servers"]) - len(self.servers)
        await server.wait_ready(self.settings.start_timeout)

    def _without_per_request_metrics(self, name: str, error: str) -> None:
        """The engine refused per-request acceptance: relaunch without it (Prometheus deltas instead)."""
        old = self.servers[name]
        old.stop()                              # reaps the refused start's process group
        at = old.command.argv.index(PER_REQUEST_METRICS[0])
        argv = old.command.argv[:at] + old.command.argv[at + len(PER_REQUEST_METRICS):]
        command = dataclasses.replace(old.command, argv=argv)
        self.commands[name] = command
        self.servers[name] = LaunchedServer(command, old.log_path)
        self.servers[name].starts = old.starts
        entry = self.entry(name)
        entry.update(command=command.text(), argv=argv, per_request_metrics=False,
                     per_request_refused=error)

    def note_exit(self, name: str) -> dict | None:
        """Record that `name`'s server has exited (once per start); the entry, or None if it runs."""
        server = self.servers[name]
        code = server.exit_code()
        if code is None:
            return None
        exits = self.entry(name)["exits"]
        if not exits or exits[-1]["start"] != server.starts:
            exits.append({"start": server.starts, "code": code, "time": time.strftime("%H:%M:%S"),
                          "last_lines": server.log_tail()})
        return exits[-1]

    def stop(self, name: str) -> None:
        self.servers[name].stop()
        if self.current == name:
            self.current = None

    def targets(self, **http) -> list["LaunchedTarget"]:
        return [LaunchedTarget(spec, self, HttpTarget(name=spec.name, base_url=self.commands[spec.name].url,
                                                      method=spec.method, extra_body=self._ask(spec), **http))
                for spec in self.specs]

    def _ask(self, spec: ArmSpec) -> dict:
        """Request fields that ask a speculating arm's engine for each request's acceptance (SGLang's)."""
        return dict(SGLANG_REQUEST) if self.settings.engine == "sglang" and spec.method != "off" else {}


class LaunchedTarget:
    """An arm served by a server this run launched: an HttpTarget plus the server's life."""

    def __init__(self, spec: ArmSpec, pool: ServerPool, http: HttpTarget):
        self.name, self.method, self.pool, self.http = spec.name, spec.method, pool, http

    async def start(self) -> None:
        await self.http.start()
        if self.pool.side_by_side:
            await self.pool.ensure_up(self.name)
            await self._name_model()

    async def _name_model(self) -> None:
        """No --served-model: the model the server lists first (an --engine-args name included)."""
        if self.http.model is None:
            self.http.model = await self.http.first_model()

    async def activate(self) -> bool:
        """Blocks: bring this arm's server up (True when it was started: the runner warms it up)."""
        exited = self.pool.note_exit(self.name)
        if exited is not None and self.pool.settings.on_server_exit == "stop":
            raise ServerExited(self._exit_text(exited) + "; stopped (--on-server-exit stop)")
        if self.pool.side_by_side:
            return False
        started = await self.pool.ensure_up(self.name)
        await self._name_model()
        return started

    async def reconnect(self) -> None:
        await self.http.reconnect()

    async def close(self) -> None:
        await self.http.close()
        self.pool.stop(self.name)

    async def server_acceptance(self) -> ServerAcceptance | None:
        # blocks: the runner reads them around each block (a restart zeroes them)
        return await self.http.server_acceptance()

    async def stream(self, request: WorkloadRequest) -> AsyncIterator[StreamEvent]:
        exited = self.pool.note_exit(self.name)
        if exited is not None:
            raise TargetError(self._exit_text(exited))
        try:
            async for event in self.http.stream(request):
                yield event
        except TargetError:
            exited = await self._exited_soon()
            if exited is not None:
                raise TargetError(self._exit_text(exited)) from None
            raise

    async def _exited_soon(self) -> dict | None:
        deadline = time.monotonic() + EXIT_WAIT
        while time.monotonic() < deadline:
            exited = self.pool.note_exit(self.name)
            if exited is not None:
                return exited
            await asyncio.sleep(0.05)
        return None

    def _exit_text(self, exited: dict) -> str:
        return f"the server of arm {self.name} exited (code {exited['code']})"
