"""MPS: one control daemon per GPU, driven through ``nvidia-cuda-mps-control``.

Each GPU gets its own pipe and log directory under a base directory, so daemons of
different GPUs never share a pipe. Co-located serving processes must be started
with the environment ``client_env`` returns.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from energyopt.nvml.errors import MpsError

DEFAULT_BASE_DIR = "/tmp/energyopt-mps"
MPS_CONTROL = "nvidia-cuda-mps-control"


def mps_dirs(base_dir: str, device_uuid: str) -> tuple[str, str]:
    """Pipe and log directory of the MPS daemon of GPU ``device_uuid``."""
    root = Path(base_dir) / device_uuid
    return str(root / "pipe"), str(root / "log")


def client_env(base_dir: str, device_uuid: str, pct: int) -> dict[str, str]:
    """Environment a serving process needs to run on GPU ``device_uuid`` with ``pct`` % SMs."""
    pipe, log = mps_dirs(base_dir, device_uuid)
    return {
        "CUDA_MPS_PIPE_DIRECTORY": pipe,
        "CUDA_MPS_LOG_DIRECTORY": log,
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(pct),
        "CUDA_VISIBLE_DEVICES": device_uuid,
    }


class SubprocessMps:
    """MpsControl on the real ``nvidia-cuda-mps-control`` binary."""

    def __init__(self, binary: str = MPS_CONTROL, timeout_s: float = 30.0) -> None:
        self.binary = binary
        self.timeout_s = timeout_s

    def _env(self, pipe_dir: str, log_dir: str | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env["CUDA_MPS_PIPE_DIRECTORY"] = pipe_dir
        if log_dir is not None:
            env["CUDA_MPS_LOG_DIRECTORY"] = log_dir
        return env

    def _run(self, args: list[str], env: dict[str, str], stdin: str = "") -> str:
        path = shutil.which(self.binary)
        if path is None:
            raise MpsError(
                f"{self.binary} not found: install the NVIDIA driver utilities (it ships with "
                "the driver) or put it on PATH"
            )
        try:
            done = subprocess.run(
                [path, *args],
                input=stdin,
                env=env,
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise MpsError(f"{self.binary} did not answer within {self.timeout_s:g} s") from None
        if done.returncode != 0:
            msg = (done.stderr or done.stdout).strip()
            raise MpsError(f"{self.binary} {' '.join(args)} failed: {msg}")
        return done.stdout.strip()

    def is_running(self, pipe_dir: str) -> bool:
        return (Path(pipe_dir) / "control").exists()

    def start(self, pipe_dir: str, log_dir: str, device_uuid: str) -> None:
        Path(pipe_dir).mkdir(parents=True, exist_ok=True)
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        env = self._env(pipe_dir, log_dir)
        env["CUDA_VISIBLE_DEVICES"] = device_uuid
        self._run(["-d"], env)

    def stop(self, pipe_dir: str) -> None:
        if self.is_running(pipe_dir):
            self._run([], self._env(pipe_dir), stdin="quit\n")

    def get_default_percentage(self, pipe_dir: str) -> int:
        out = self._run([], self._env(pipe_dir), stdin="get_default_active_thread_percentage\n")
        try:
            return int(float(out.split()[-1]))
        except (ValueError, IndexError):
            raise MpsError(f"unexpected answer from {self.binary}: {out!r}") from None

    def set_default_percentage(self, pipe_dir: str, pct: int) -> None:
        self._run([], self._env(pipe_dir), stdin=f"set_default_active_thread_percentage {pct}\n")
