"""`statekit broker start|status|stop|stats|clean` and the errors a person sees."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from statekit import broker as broker_mod


def _cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "statekit.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_cli_start_reuse_status_stop(tmp_path):
    d = str(tmp_path / "cli")
    r = _cli("broker", "start", "--dir", d, "--port", "0")
    try:
        assert r.returncode == 0, r.stderr
        bootstrap = r.stdout.strip()
        assert bootstrap.startswith("127.0.0.1:")
        with open(os.path.join(d, "broker.json")) as f:
            info = json.load(f)
        assert info["bootstrap"] == bootstrap and info["port"] == int(bootstrap.split(":")[1])
        r2 = _cli("broker", "start", "--dir", d, "--port", "0")
        assert r2.returncode == 0 and r2.stdout.strip() == bootstrap
        assert "reusing" in r2.stderr
        st = _cli("broker", "status", "--dir", d)
        assert st.returncode == 0 and bootstrap in st.stdout
        # the port is taken: a clear one-line error
        r3 = _cli("broker", "start", "--dir", str(tmp_path / "other"), "--port", bootstrap.split(":")[1])
        assert r3.returncode != 0
        assert r3.stderr.strip().count("\n") == 0 and "already in use" in r3.stderr
        stats = _cli("broker", "stats", "--dir", d, "--json")
        assert stats.returncode == 0 and json.loads(stats.stdout) == []
    finally:
        sp = _cli("broker", "stop", "--dir", d)
    assert sp.returncode == 0, sp.stderr
    assert broker_mod.status(d) is None
    st = _cli("broker", "status", "--dir", d)
    assert st.returncode == 1 and "no broker running" in st.stdout


def test_cli_bad_input_errors(tmp_path):
    r = _cli("broker", "start", "--dir", str(tmp_path / "x"), "--port", "0", "--config", "no.such.config=1")
    assert r.returncode != 0 and "unknown broker config 'no.such.config'" in r.stderr
    ro = tmp_path / "ro"
    ro.write_text("a file, not a directory")
    r = _cli("broker", "start", "--dir", str(ro / "sub"), "--port", "0")
    assert r.returncode != 0 and "not writable" in r.stderr and r.stderr.strip().count("\n") == 0
    r = _cli("broker", "clean", "--dir", str(tmp_path / "none"))
    assert r.returncode != 0 and "no broker is running" in r.stderr
