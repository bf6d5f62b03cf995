"""The worker processes of one fuzzed run: started, SIGKILLed, deployed again with a changed
definition, and all killed when the run is over (each in its own process group, so the MCP
server a worker started goes with it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import IO

from bench.chaos_model import Plan

ROOT = Path(__file__).resolve().parent.parent


class Rig:
    """One run's worker processes (each in its own process group, so nothing outlives it)."""

    def __init__(self, address: str, model_url: str, model: str, plan: Plan, work: Path) -> None:
        self.address = address
        self.model_url = model_url
        self.model = model
        self.model_name = model
        """The name the deployed agents call the model by (a deploy may change it: the
        scripted server answers it as :attr:`model`)."""
        self.approvals = "as written"
        """Which tools a person approves: ``flipped`` after a deploy that changed it."""
        self.plan = plan
        self.work = work
        self.task_queue = f"chaos-{plan.seed}-{uuid.uuid4().hex[:8]}"
        self.version = 1
        self.live: list[subprocess.Popen[bytes]] = []
        self.started: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []

    @property
    def write_log(self) -> Path:
        return self.work / "writes.log"

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "RELAYKIT_"))}
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT), *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])]
        )
        env.update(
            TEMPORAL_ADDRESS=self.address,
            TEMPORAL_NAMESPACE="default",
            RELAYKIT_STORE=(self.work.parent / "store").as_uri(),  # the client's too
            RELAYKIT_TRANSCRIPT_DIR=str(self.work / "transcripts"),
            PYTHONUNBUFFERED="1",
            CHAOS_MODEL_URL=self.model_url,
            CHAOS_MODEL_NAME=self.model_name,
            CHAOS_FEATURES=",".join(self.plan.features),
            CHAOS_VERSION=str(self.version),
            CHAOS_APPROVALS=self.approvals,
            CHAOS_LOG=str(self.write_log),
            MCP_TEST_LOG=str(self.mcp_log),
        )
        return env

    def start(self) -> None:
        log = open(self.work / f"worker-{len(self.started) + 1}-v{self.version}.log", "wb")  # noqa: SIM115
        self._logs.append(log)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "relaykit.cli",
                "worker",
                "bench.chaos_agents:agents",
                "--task-queue",
                self.task_queue,
                "--graceful-shutdown",
                "5",
            ],
            cwd=ROOT,
            env=self.environment(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.live.append(proc)
        self.started.append(proc)

    def kill(self) -> None:
        """SIGKILL the newest worker, as a crash would (its MCP server sees its stdin close)."""
        if self.live:
            proc = self.live.pop()
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)

    @property
    def mcp_log(self) -> Path:
        return self.work / "mcp.log"

    def kill_mcp_servers(self) -> int:
        """SIGKILL the MCP servers of the live workers (their stdio subprocesses), as a server
        crash would; the workers go on. How many were killed."""
        workers = {p.pid for p in self.live}
        killed = 0
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                command = (entry / "cmdline").read_bytes()
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if parent in workers and b"mcp_docs_server.py" in command:
                try:
                    os.kill(int(entry.name), signal.SIGKILL)
                    killed += 1
                except ProcessLookupError:
                    pass
        return killed

    def stop_oldest(self) -> None:
        """SIGTERM: a graceful shutdown, as a deploy does."""
        if self.live:
            proc = self.live.pop(0)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def close(self) -> None:
        for proc in self.started:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the worker and its MCP server
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for log in self._logs:
            log.close()
