"""Score the doctor on the corpus (tests/hang_corpus/cases.py): each case runs under
`phalanx watch --nproc-per-node 2 (4 for a 4-rank class) --hang-timeout-s T`, with torch's
flight recorder on, in a directory of its own; its
score says whether the report's conclusion — hang-report.txt's "Most likely cause:" line,
else the launcher's last line on stderr — names the culprit rank, the parting line, the
collective and the cause, and how long after the fault (the script's mark) the report
came. The per-rank lines and the stacks are not scored: they name every rank and every
frame. A healthy case is right when no report came. Beside it, torch's own analyser
(`python -m torch.distributed.flight_recorder.fr_trace`) on the dumps the ranks wrote at
the report, scored the same way (its "missing ranks", stack trace and collective).

    python tests/hang_corpus/score.py [--timeout-s 4] [--only NAME ...] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))  # (tests/: procs)
from cases import CASES, Case  # noqa: E402

from procs import watch  # noqa: E402


@dataclass
class Score:
    case: Case
    report: str  # what the user read: the hang report, else stderr's last line
    seconds: float | None  # from the fault's mark to the report (None: none came)
    exit_code: int
    torch_said: str | None = None  # torch's analyser on the ranks' dumps (None: no dumps)

    @property
    def came(self) -> bool:
        return self.exit_code != 0

    def right(self, what: str, analyser: bool = False) -> bool | None:
        """Whether the report (`analyser`: torch's analyser's conclusion instead) names `what`
        ("culprit", "line", "collective", "cause"); None when the case has nothing to
        name."""
        expected = getattr(self.case, what)
        text = (self.torch_said or "") if analyser else self.report
        if self.case.healthy or not expected:
            return None
        if what == "culprit":  # "rank 1", "rank(s) 1", "[rank 1]"; torch: "missing ranks: {1}"
            number = expected.split()[-1]
            return re.search(rf"\branks?(?:\(s\))? {number}\b", text) is not None or \
                re.search(rf"missing ranks: {{[^}}]*\b{number}\b", text) is not None
        if what == "cause":  # "sizes differ": torch says "size"/"dtype" mismatches its way
            word = expected.split()[0].rstrip("s")
            return expected in text or (analyser and word in text.lower())
        return expected.replace("-", "_") in text.replace("-", "_")

    @property
    def verdict(self) -> str:
        if self.case.healthy:
            return "right (no report)" if not self.came else "FALSE ALARM"
        if not self.came:
            return "MISSED (no report)"
        return self._graded(analyser=False)

    @property
    def torch_verdict(self) -> str:
        if self.case.healthy:
            return "–"
        if self.torch_said is None:
            return "no dumps"
        if "Traceback" in self.torch_said:
            return "crashed"
        return self._graded(analyser=True)

    def _graded(self, analyser: bool) -> str:
        named = [self.right(w, analyser) for w in ("culprit", "line", "collective", "cause")]
        return "right" if all(n is not False for n in named) else "partly"


FR_PREFIX = "dump_"  # each rank's flight-recorder dump: WHERE/fr/dump_<rank>


def run_case(case: Case, where: Path, timeout_s: float) -> Score:
    shutil.rmtree(where, ignore_errors=True)  # (no report of an earlier run read)
    (where / "fr").mkdir(parents=True)
    script = where / "case.py"
    script.write_text(case.script())
    recorder = {"TORCH_FR_BUFFER_SIZE": "2000",
                "TORCH_FR_DUMP_TEMP_FILE": str(where / "fr" / FR_PREFIX)}
    try:
        proc = watch(script, "--threads-per-rank", "1", "--hang-timeout-s", f"{timeout_s:g}",
                     cwd=where, timeout=240, ranks=case.ranks, env=recorder)
    except subprocess.TimeoutExpired:
        return Score(case, "(no report in 240 s)", None, 124)
    report_file = where / "hang-report.txt"
    lines = proc.stderr.strip().splitlines()
    if report_file.exists():
        found = [line for line in report_file.read_text().splitlines()
                 if line.startswith("Most likely cause:")]
        conclusion, end = " ".join(found), report_file.stat().st_mtime
    else:  # the launcher's account: its last line (when it ended: the report's time)
        conclusion, end = (lines[-1] if lines else ""), time.time()
    marks = [float(p.read_text()) for p in where.glob("mark-*")]
    seconds = end - max(marks) if marks and proc.returncode != 0 else None
    return Score(case, conclusion, seconds, proc.returncode, torch_analysis(where / "fr"))


def torch_analysis(dumps: Path) -> str | None:
    """What torch's own flight-recorder analyser says of the ranks' dumps (None: none)."""
    if not any(dumps.glob(f"{FR_PREFIX}*")):
        return None
    done = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                           str(dumps), "-p", FR_PREFIX, "--print_stack_trace",
                           "--allow-incomplete-ranks"],
                          capture_output=True, text=True, timeout=120)
    return done.stdout + done.stderr


def table(scores: list[Score], timeout_s: float) -> str:
    def mark(value: bool | None) -> str:
        return "–" if value is None else ("yes" if value else "**no**")

    rows = ["| class | ranks | verdict | culprit rank | parting line | collective | cause | "
            "seconds to report | torch's analyser (culprit, line, collective) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for s in scores:
        secs = "–" if s.seconds is None else f"{s.seconds:.1f}"
        theirs = s.torch_verdict
        if s.torch_said is not None and theirs not in ("crashed", "–"):
            theirs += " (" + ", ".join(mark(s.right(w, analyser=True))
                                       for w in ("culprit", "line", "collective")) + ")"
        rows.append(f"| {s.case.name} | {s.case.ranks} | {s.verdict} | "
                    f"{mark(s.right('culprit'))} | {mark(s.right('line'))} | "
                    f"{mark(s.right('collective'))} | {mark(s.right('cause'))} | {secs} | "
                    f"{theirs} |")
    alarms = sum(1 for s in scores if s.case.healthy and s.came)
    healthy = sum(1 for s in scores if s.case.healthy)
    return "\n".join(rows) + (f"\n\ngloo, `--hang-timeout-s {timeout_s:g}`, the flight "
                              f"recorder on (TORCH_FR_BUFFER_SIZE=2000); false alarms: "
                              f"{alarms} of {healthy} healthy case(s).\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout-s", type=float, default=4.0)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--markdown", default=None)
    parser.add_argument("--work", default="/tmp/phalanx-hang-corpus")
    args = parser.parse_args()
    chosen = [c for c in CASES if args.only is None or c.name in args.only]
    scores = []
    for i, case in enumerate(chosen):
        scores.append(run_case(case, Path(args.work) / f"case{i:02d}", args.timeout_s))
        print(f"{case.name}: {scores[-1].verdict}", flush=True)
    text = table(scores, args.timeout_s)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
