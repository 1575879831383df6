"""StopSignals (issue 25, item 1): two stop signals arriving together never raise
CPython's "Signal N ignored due to race condition"; a second, later one stops a process
whose main thread is stuck in C; a request made during start-up carries over."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

RACE = textwrap.dedent("""
    import os, signal, sys
    from phalanx.cluster.lifecycle import StopSignals
    stop = StopSignals().install()
    both = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, both)
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGTERM)
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, both)  # both handlers run now
        for _ in range(1000):
            sum(range(100))  # the eval loop checks for pending signals
    except OSError as exc:
        print("RAISED", exc)
        sys.exit(1)
    import time
    time.sleep(0.2)  # the counting thread reads the wakeup fd
    print("requested", stop.requested)
    stop.restore()
""")


def _python(code: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def test_sigint_and_sigterm_together_raise_nothing():
    proc = _python(RACE)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    assert "race condition" not in out + err
    assert "requested 2" in out or "requested 15" in out  # one request


STUCK = textwrap.dedent("""
    import ctypes, sys
    from phalanx.cluster.lifecycle import StopSignals
    stop = StopSignals().install()
    print("ready", flush=True)
    ctypes.CDLL(None).system(b"exec sleep 12 </dev/null >/dev/null 2>&1")  # in C (waitpid retried on EINTR): no
    # Python handler can run until it returns
    print("returned", stop.requested, flush=True)
""")


def _ready(proc: subprocess.Popen) -> None:
    assert proc.stdout.readline().strip() == "ready"


def test_a_second_signal_later_stops_a_process_stuck_in_c():
    proc = _python(STUCK)
    _ready(proc)
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    time.sleep(2.5)  # past the grace period: a second request, not the same one twice
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=20)
    assert proc.returncode == 143
    assert time.monotonic() - start < 8  # not the 12 s of the C call


def test_a_second_signal_at_once_is_the_same_request():
    proc = _python(STUCK.replace("sleep 12", "sleep 3"))
    _ready(proc)
    proc.send_signal(signal.SIGTERM)  # (system() ignores SIGINT in its caller while it waits)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)  # e.g. the agent's forward of a signal that also came
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "returned 15" in out


def test_a_request_made_before_install_carries_over():
    code = textwrap.dedent("""
        import os, signal, time
        from phalanx.cluster.lifecycle import StopSignals
        outer = StopSignals().install()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        inner = StopSignals().install()
        print("inner", inner.requested)
        inner.restore()
        outer.restore()
        print("default back", signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)
    """)
    proc = _python(code)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "inner 15" in out and "default back True" in out


def test_sigterm_outside_the_loop_unwinds_or_ends_a_process_stuck_in_c():
    """phalanx.cli.entry's SIGTERM: a Python exception where Python runs (one line, 143);
    where the main thread is stuck in C, the process still ends, `delay_s` later."""
    code = textwrap.dedent("""
        import ctypes, sys
        from phalanx.cluster.lifecycle import terminate_gently
        class Terminated(Exception):
            pass
        def handler(signum, frame):
            raise Terminated()
        terminate_gently(handler, delay_s=0.5)
        try:
            print("ready", flush=True)  # (inside: the signal may come at once)
            if sys.argv[1] == "c":
                ctypes.CDLL(None).system(b"exec sleep 12 </dev/null >/dev/null 2>&1")
            else:
                import time
                time.sleep(12)
        except Terminated:
            print("unwound", flush=True)
            sys.exit(143)
    """)
    for where, said in (("python", "unwound"), ("c", "")):
        proc = subprocess.Popen([sys.executable, "-c", code, where], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        _ready(proc)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 143, (where, err)
        assert said in out
        assert time.monotonic() - start < 6, where  # not the 12 s of the sleep
