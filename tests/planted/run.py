"""Planted regressions: each `*.patch` here is a small change to the code under test
that an earlier test let pass; its first line names the test that must now fail
(`test: <pytest node id>`), its second says what it plants.

On demand, not in CI (each run copies the tree and runs a test):

    python tests/planted/run.py                 # every patch
    python tests/planted/run.py item2 item5     # the patches whose names start so
    python tests/planted/run.py --baseline …    # also check the test passes unpatched

For each patch: copy the working tree (tracked and untracked files, not the ignored
ones) to a temporary folder — never the shared checkout — apply the patch there, run
the named test with that copy's `src` first on the path, and expect it to fail. The
report gives one line per patch: CAUGHT (with the failing assertion) or MISSED. Exit
status: 0 when every patch was caught (and, with --baseline, every test passed
unpatched), else 1.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def header(patch: Path) -> tuple[str, str]:
    """(test id, what it plants) from the patch's first two lines."""
    lines = patch.read_text().splitlines()
    if len(lines) < 2 or not lines[0].startswith("test: ") or not lines[1].startswith(
            "planted: "):
        raise SystemExit(f"{patch.name}: the first two lines must be `test: <id>` and "
                         f"`planted: <what>`")
    return lines[0][len("test: "):].strip(), lines[1][len("planted: "):].strip()


def copy_tree(dest: Path) -> None:
    """The working tree as it is now: tracked and untracked-but-not-ignored files."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def run_test(tree: Path, test: str, timeout: int) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tree / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-rf",
                               "-p", "no:cacheprovider", test], cwd=tree, env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout} s"
    return done.returncode, done.stdout + done.stderr


def failing_line(output: str) -> str:
    """The short summary's FAILED line (test id - assertion), else the first `E` line."""
    failed = [ln[len("FAILED "):] for ln in output.splitlines() if ln.startswith("FAILED ")]
    errors = [ln[1:].strip() for ln in output.splitlines() if ln.startswith("E ")]
    if failed and " - " in failed[0]:
        return failed[0][:400]
    last = output.strip().splitlines()[-1:] or ["?"]
    return " - ".join([*failed[:1], *(errors[:1] or last)])[:400]


def check(patch: Path, baseline: bool, timeout: int) -> bool:
    test, what = header(patch)
    with tempfile.TemporaryDirectory(prefix="phalanx-planted-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        if baseline:
            rc, out = run_test(tree, test, timeout)
            if rc != 0:
                print(f"BASELINE FAILS {patch.name}: {test} fails unpatched: "
                      f"{failing_line(out)}")
                return False
        applied = subprocess.run(["git", "apply", "--unidiff-zero", str(patch)], cwd=tree,
                                 capture_output=True, text=True)
        if applied.returncode:
            print(f"NOT APPLIED {patch.name}: {applied.stderr.strip()}")
            return False
        start = time.monotonic()
        rc, out = run_test(tree, test, timeout)
    took = time.monotonic() - start
    if rc == 1:
        print(f"CAUGHT {patch.name} ({what}) in {took:.0f} s: {failing_line(out)}")
        return True
    print(f"MISSED {patch.name} ({what}): {test} exit {rc}: {failing_line(out)}")
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prefixes", nargs="*", help="run the patches starting so")
    parser.add_argument("--baseline", action="store_true",
                        help="first check that each test passes without its patch")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per test run")
    ns = parser.parse_args(argv)
    patches = sorted(p for p in HERE.glob("*.patch")
                     if not ns.prefixes or p.name.startswith(tuple(ns.prefixes)))
    if not patches:
        print("no patch matched", file=sys.stderr)
        return 1
    results = [check(p, ns.baseline, ns.timeout) for p in patches]
    print(f"{sum(results)} of {len(results)} planted regressions caught")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
