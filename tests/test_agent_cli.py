"""`energyopt agent` as a process on the simulated NVML: apply, boost, scrape, SIGKILL,
restart (reconciled to the plan), SIGTERM (originals restored). Every wait is bounded."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from energyopt.agent import AgentClient
from energyopt.catalog import builtin_catalog
from energyopt.nvml.sim import SimulatedNvml
from tests.test_agent import H100, PLAN

START_TIMEOUT_S = 120.0
"""Starting imports the catalog and the solvers' modules: slow on a loaded machine."""


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="eoagent-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "energyopt.cli", "agent", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    mark = log.read_text().count("listening on")
    while time.monotonic() < deadline:
        if log.read_text().count("listening on") > mark:
            return proc
        if proc.poll() is not None:
            raise AssertionError(f"agent exited {proc.returncode}: {log.read_text()}")
        time.sleep(0.1)
    proc.kill()
    proc.wait(10)
    raise AssertionError(f"agent did not start: {log.read_text()}")


def test_agent_process_kill_restart_and_stop(tmp_path: Path, sock_dir: Path) -> None:
    sim_state = tmp_path / "sim.json"
    env = dict(
        os.environ,
        ENERGYOPT_NVML_BACKEND="sim",
        ENERGYOPT_NVML_SIM_STATE=str(sim_state),
        ENERGYOPT_NVML_SIM_GPUS=f"{H100}x4",
    )
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "version: 1\ngpus: [0, 1, 2]\nclock_mhz: {min: 800, max: 1700}\n"
        "power_limit_w: {min: 250, max: 500}\n"
        f"allow:\n  status: any\n  apply: {{uids: [{os.getuid()}]}}\n"
        f"  set_clock: {{uids: [{os.getuid()}]}}\n  restore: {{uids: [{os.getuid()}]}}\n"
    )
    sock = sock_dir / "agent.sock"
    log = tmp_path / "agent.log"
    args = [
        "--policy", str(policy), "--socket", str(sock), "--state-dir", str(tmp_path / "state"),
        "--mps-dir", str(tmp_path / "mps"), "--metrics", "127.0.0.1:0",
    ]  # fmt: skip
    catalog = builtin_catalog()
    original = SimulatedNvml([catalog.gpu(H100)] * 4).snapshot()

    def saved() -> SimulatedNvml:
        return SimulatedNvml.load(sim_state, catalog.gpus)

    proc = start(args, log, env)
    try:
        assert oct(sock.stat().st_mode & 0o777) == "0o660"
        with AgentClient(sock, timeout_s=30) as c:
            c.apply(PLAN)
            c.set_clock("n/1", 1410)
        assert saved().get_locked_clocks(1) == (1410, 1410)  # kept as a GPU keeps it
        port = re.findall(r"metrics on http://127\.0\.0\.1:(\d+)/", log.read_text())[-1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
            text = resp.read().decode()
        assert 'energyopt_gpu_sm_clock_mhz{gpu="1",plan_gpu="n/1"' in text
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert saved().get_locked_clocks(1) == (1410, 1410)  # nobody restored anything

        proc = start(args, log, env)
        with AgentClient(sock, timeout_s=30) as c:
            status = c.status()
        assert status["plan_id"].startswith("agent-test@")
        assert any("returned to the plan" in note for note in status["reconciled"])
        assert saved().get_locked_clocks(1) == (1320, 1320)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert "restored" in log.read_text()
    assert saved().snapshot() == original
    assert not sock.exists()


def test_agent_bad_input_names_file_and_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit status 2 with the file and the field, before any GPU is touched."""
    from energyopt.cli import main

    monkeypatch.setenv("ENERGYOPT_NVML_BACKEND", "sim")
    monkeypatch.setenv("ENERGYOPT_NVML_SIM_STATE", str(tmp_path / "sim.json"))
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "version: 1\ngpus: all\nclock_mhz: {min: 900}\npower_limit_w: {min: 1, max: 2}\n"
    )
    common = ["agent", "--policy", str(policy), "--state-dir", str(tmp_path / "state")]
    assert main([*common, "--socket", str(tmp_path / "s")]) == 2
    assert f"{policy}: clock_mhz.max" in capsys.readouterr().err
    policy.write_text(
        "version: 1\ngpus: all\nclock_mhz: {min: 900, max: 1500}\npower_limit_w: {min: 1, max: 2}\n"
    )
    assert main([*common, "--socket", str(tmp_path / "s"), "--metrics", "9400"]) == 2
    assert "--metrics '9400': expected HOST:PORT" in capsys.readouterr().err
    assert main([*common, "--socket", str(tmp_path / "s"), "--tcp", "127.0.0.1:0"]) == 2
    assert "--tcp: needs --tls-cert, --tls-key and --tls-client-ca" in capsys.readouterr().err
    taken = tmp_path / "plain-file"
    taken.write_text("")
    assert main([*common, "--socket", str(taken)]) == 2
    assert f"{taken}: --socket: exists and is not a socket" in capsys.readouterr().err
    assert taken.read_text() == ""
