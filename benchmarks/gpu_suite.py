"""The GPU tier in one command, and its figures: runs `pytest -m cuda tests/cuda` (each
test's outcome, time and measured figures), then gpt2-124m bf16 training throughput,
eager and compiled, with MFU against this device's own dense bf16 peak
(phalanx.runtime.peaks; "unknown device: no MFU" for one not in its table). Prints a
markdown summary; writes the JSON (`--out`) and can put the markdown into docs/gpu.md's
figures section (`--doc`). Aimed at under ten minutes on one H100-class GPU.

    python benchmarks/gpu_suite.py --out docs/gpu-figures.json --doc docs/gpu.md
    python benchmarks/gpu_suite.py --render docs/gpu-figures.json   # markdown again

Without a GPU it says so and exits 2 (`--render` works anywhere).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from phalanx.paths import atomic_write

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "cuda" / "worker.py"
START, END = "<!-- gpu-figures:start -->", "<!-- gpu-figures:end -->"
TIER_TIMEOUT_S = 480
THROUGHPUT_TIMEOUT_S = 240


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", metavar="FILE.json", help="write the figures as JSON here")
    p.add_argument("--doc", metavar="FILE.md", help="replace the figures section of this "
                   f"markdown file (between {START} and {END})")
    p.add_argument("--render", metavar="FILE.json", help="only print (and with --doc, "
                   "write) the markdown of figures saved before; needs no GPU")
    p.add_argument("--skip-tests", action="store_true", help="throughput only")
    p.add_argument("--steps", type=int, default=30, help="timed steps per throughput run")
    p.add_argument("--micro-batch-size", type=int, default=8,
                   help="sequences of 1024 tokens per step (lower it on a small GPU)")
    args = p.parse_args(argv)
    if args.steps < 1 or args.micro_batch_size < 1:
        p.error("--steps and --micro-batch-size must be at least 1")
    return args


def run_tier(work: Path) -> tuple[list[dict], list[dict]]:
    """(each test's outcome, the figures the tests recorded)."""
    xml, figures = work / "tier.xml", work / "figures.jsonl"
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", str(ROOT / "tests" / "cuda"), "-q",
           "-p", "no:cacheprovider", f"--junitxml={xml}"]
    env = {**os.environ, "PHALANX_GPU_FIGURES": str(figures)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True)
    try:
        rc = proc.wait(timeout=TIER_TIMEOUT_S)
        problem = None if rc in (0, 1, 5) else f"pytest exited {rc}"
    except subprocess.TimeoutExpired:  # the tests' workers and trainers too: the GPU freed
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        problem = f"the tier ran past {TIER_TIMEOUT_S} s and was stopped"
    tests = junit_outcomes(xml.read_text()) if xml.exists() else []
    if problem is None and not tests:
        problem = "pytest wrote no results (no JUnit XML)"
    if problem is not None:  # counted as a failure, never as a clean run
        print(f"gpu_suite: {problem}", file=sys.stderr)
        tests.append({"test": "tests/cuda (the tier)", "outcome": "error", "seconds": 0.0,
                      "message": problem})
    found = [json.loads(line) for line in figures.read_text().splitlines()] \
        if figures.exists() else []
    return tests, found


def junit_outcomes(text: str) -> list[dict]:
    """[{test, outcome, seconds, message}] from pytest's JUnit XML."""
    rows = []
    for case in ET.fromstring(text).iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = (node.get("message") or "").splitlines()[0][:200] \
                    if node.get("message") else ""
                break
        rows.append({"test": f"{case.get('classname')}::{case.get('name')}",
                     "outcome": outcome, "seconds": float(case.get("time") or 0.0),
                     "message": message})
    return rows


def run_throughput(work: Path, args: argparse.Namespace) -> list[dict]:
    rows = []
    for compile_ in (False, True):
        out = work / f"throughput-{compile_}.json"
        opts = {"steps": args.steps, "warmup": 10, "micro_batch_size": args.micro_batch_size,
                "compile": compile_}
        try:
            proc = subprocess.run([sys.executable, str(WORKER), "throughput", str(out),
                                   json.dumps(opts)], cwd=work, capture_output=True,
                                  text=True, timeout=THROUGHPUT_TIMEOUT_S)
            error = proc.stderr[-800:] if proc.returncode != 0 or not out.exists() else None
        except subprocess.TimeoutExpired:
            error = f"ran past {THROUGHPUT_TIMEOUT_S} s"
        rows.append({"compile": compile_, "error": error} if error else
                    json.loads(out.read_text()))
    return rows


def environment() -> dict:
    import torch

    name = torch.cuda.get_device_name()
    from phalanx.runtime.peaks import peak_for

    peak = peak_for(name)
    return {"device_name": name, "peak_row": None if peak is None else peak.device,
            "peak_tflops": None if peak is None else peak.bf16_flops / 1e12,
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, v)) if isinstance(v := torch.cuda.nccl.version(), tuple)
            else str(v),
            "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def render(result: dict) -> str:
    """The markdown for docs/gpu.md's figures section."""
    env = result["environment"]
    peak = f"{env['peak_tflops']:g} TFLOP/s dense bf16 ({env['peak_row']})" \
        if env.get("peak_tflops") else "unknown device: no MFU"
    lines = [f"Measured {env['when']} on **{env['device_name']}** (peak {peak}); torch "
             f"{env['torch']}, CUDA {env['cuda']}, NCCL {env['nccl']}; the suite took "
             f"{result['wall_s']:.0f} s.", ""]
    if result["tests"]:
        counts = {o: sum(t["outcome"] == o for t in result["tests"])
                  for o in ("passed", "failed", "error", "skipped")}
        lines += [", ".join(f"{n} {o}" for o, n in counts.items() if n) + ".", "",
                  "| test | outcome | s | note |", "|---|---|---:|---|"]
        lines += [f"| `{t['test'].rsplit('.', 1)[-1]}` | {t['outcome']} | {t['seconds']:.1f} "
                  f"| {_cell(t['message'])} |" for t in result["tests"]]
        lines.append("")
    lines += ["| gpt2-124m bf16 | tokens/s | MFU | step ms | peak memory GiB |",
              "|---|---:|---:|---:|---:|"]
    for row in result["throughput"]:
        mode = "compiled" if row.get("compile") else "eager"
        if "error" in row:
            last = (row["error"].strip().splitlines() or ["?"])[-1]
            lines.append(f"| {mode} | failed: {_cell(last)} | | | |")
            continue
        mfu = f"{row['mfu']:.1%}" if row.get("mfu") is not None else "no MFU (unknown device)"
        lines.append(f"| {mode}, micro-batch {row['micro_batch_size']} | "
                     f"{row['tokens_per_s']:,.0f} | {mfu} | {row['step_s'] * 1e3:.1f} | "
                     f"{row['max_allocated'] / 2**30:.1f} |")
    if result["figures"]:
        lines += ["", "| figure | values |", "|---|---|"]
        for f in result["figures"]:
            values = ", ".join(f"{k} {_short(v)}" for k, v in f.items()
                               if k not in ("test", "figure"))
            lines.append(f"| {_cell(f['figure'])} | {_cell(values)} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _short(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def update_doc(path: Path, markdown: str) -> None:
    text = path.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"gpu_suite: {path} has no {START} … {END} section to fill")
    head, rest = text.split(START, 1)
    atomic_write(path, f"{head}{START}\n{markdown}{END}{rest.split(END, 1)[1]}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        result = json.loads(Path(args.render).read_text())
    else:
        import torch

        if not torch.cuda.is_available():
            print("gpu_suite: no CUDA GPU here (torch.cuda.is_available() is False); "
                  "nothing measured.", file=sys.stderr)
            return 2
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="phalanx-gpu-suite-") as tmp:
            work = Path(tmp)
            tests, figures = ([], []) if args.skip_tests else run_tier(work)
            rows = run_throughput(work, args)
        result = {"environment": environment(), "tests": tests, "figures": figures,
                  "throughput": rows, "wall_s": time.perf_counter() - t0}
        if args.out:
            atomic_write(args.out, json.dumps(result, indent=1, default=str) + "\n")
    markdown = render(result)
    print(markdown)
    if args.doc:
        update_doc(Path(args.doc), markdown)
    failed = [t for t in result["tests"] if t["outcome"] in ("failed", "error")]
    return 1 if failed or any("error" in r for r in result["throughput"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
