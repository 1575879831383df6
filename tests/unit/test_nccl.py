"""`--nccl-preset`: named NCCL variables for the workers, each said with what it does."""

from __future__ import annotations

import os
import subprocess
import sys

from phalanx.config.nccl import PRESET_NAMES, apply, preset


def test_each_preset_sets_documented_variables():
    for name in PRESET_NAMES:
        rows = preset(name, "eth1")
        assert rows and all(var.startswith(("NCCL_", "TORCH_NCCL_", "TORCH_FR_")) and value and what
                            for var, value, what in rows)
    assert ("NCCL_IB_DISABLE", "1") in [(v, x) for v, x, _ in preset("ethernet", None)]
    assert ("NCCL_SOCKET_IFNAME", "eth1") in [(v, x) for v, x, _ in preset("infiniband", "eth1")]
    assert "NCCL_SOCKET_IFNAME" not in [v for v, _, _ in preset("ethernet", None)]
    assert not {"NCCL_P2P_DISABLE", "NCCL_TIMEOUT"} & \
        {v for name in PRESET_NAMES for v, _, _ in preset(name, "eth0")}


def test_apply_keeps_what_the_user_set(monkeypatch):
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    env: dict[str, str] = {}
    lines = apply("debug", None, env, backend_is_nccl=True)
    assert "NCCL_DEBUG" not in env and env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert lines[0] == "NCCL preset `debug`:"
    assert "  NCCL_DEBUG=WARN (yours, kept; the preset has INFO)" in lines
    assert apply(None, None, env, True) == []
    assert "gloo on CPU" in apply("ethernet", None, {}, backend_is_nccl=False)[0]


def test_the_workers_get_the_preset(tmp_path):
    script = tmp_path / "show.py"
    # one write per line: two ranks share the stdout pipe (print's pieces can interleave)
    script.write_text("import os, sys\nsys.stdout.write(f\"rank {os.environ['RANK']} IB "
                      "{os.environ.get('NCCL_IB_DISABLE')}\\n\"); sys.stdout.flush()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    done = subprocess.run([sys.executable, "-m", "phalanx", "watch", "--nproc-per-node", "2",
                           "--tee-ranks", "--nccl-preset", "ethernet", str(script)],
                          capture_output=True,
                          text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "rank 0 IB 1" in done.stdout and "rank 1 IB 1" in done.stdout, done.stdout
    assert "NCCL_IB_DISABLE=1: no InfiniBand/RoCE verbs" in done.stderr
