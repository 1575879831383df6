"""`phalanx.cluster.lingering.leave_at_once`: a process that ran only Phalanx's code ends
without the interpreter's teardown (about 0.6 s once torch is imported, at the end of
every launcher and rank), and loses nothing: atexit functions run and open files are
flushed. A process that imported a user's module ends the usual way."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(tmp_path, body: str) -> subprocess.CompletedProcess:
    code = textwrap.dedent("""
        import atexit, sys
        from phalanx.cluster.lingering import leave_at_once
        class Noisy:
            def __del__(self):
                print("finalized", flush=True)  # the interpreter's teardown ran
        keep = Noisy()
        atexit.register(lambda: print("atexit ran", flush=True))
        open_file = open(sys.argv[1], "w")
        open_file.write("buffered, never closed")
    """) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code, str(tmp_path / "f.txt")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_only_phalanx_code_leaves_at_once_and_loses_nothing(tmp_path):
    proc = _run(tmp_path, """
        leave_at_once(7)
        print("returned", flush=True)
    """)
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout.split() == ["atexit", "ran"]  # no teardown: no finalizer ran
    assert (tmp_path / "f.txt").read_text() == "buffered, never closed"


def test_a_users_module_keeps_the_usual_exit(tmp_path):
    (tmp_path / "users_model.py").write_text("X = 1\n")
    proc = _run(tmp_path, """
        sys.path.insert(0, ".")
        import users_model
        leave_at_once(7)
        print("returned", flush=True)
    """)
    assert proc.returncode == 0, proc.stderr
    assert "returned" in proc.stdout and "finalized" in proc.stdout
    assert (tmp_path / "f.txt").read_text() == "buffered, never closed"


def test_a_running_thread_keeps_the_usual_exit(tmp_path):
    proc = _run(tmp_path, """
        import threading, time
        t = threading.Thread(target=time.sleep, args=(0.5,))
        t.start()
        leave_at_once(7)
        print("returned", flush=True)
    """)
    assert proc.returncode == 0, proc.stderr
    assert "returned" in proc.stdout
