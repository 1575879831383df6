"""Launching one run of a conformance script and keeping its evidence: the command, its
exit status, its stdout and stderr (files beside the run directory), its wall time."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

TIMEOUT_S = 120.0
# a launcher's or another job's variables, which would make the script join that job
_FOREIGN = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
            "MASTER_ADDR", "MASTER_PORT")
# torchrun's own summary of a failed child (its lines name no cause)
_LAUNCHER = re.compile(r"ChildFailedError|torch\.distributed\.elastic|error_file|traceback : ")
# an exception's last line, as a rank prints it (torchrun: `[rank1]: `; Phalanx: `[rank 1] `)
_RAISED = re.compile(r"^(\[rank ?\d+\]:? )?[\w.]*(Error|Exception|Interrupt|Exit)\b:?")


@dataclass
class RunResult:
    name: str  # "reference" or "life-L"
    command: list[str]
    rc: int | None  # None: timed out (killed)
    seconds: float
    stdout: str  # paths of the kept output
    stderr: str

    def last_line(self) -> str:
        """What ended it: the first exception a rank raised (`[rank1]: XError: ...`: the
        root cause, before its peers' lost connections), else the last `error: ` line (a
        launcher's summary), else the last line of its stderr that is not a rule."""
        lines = [ln.strip() for ln in Path(self.stderr).read_text(errors="replace")
                 .splitlines() if ln.strip() and not _LAUNCHER.search(ln)]
        raised = [ln for ln in lines if _RAISED.search(ln)]
        said = [ln for ln in lines if "error: " in ln or "timed out" in ln]
        plain = [ln for ln in lines if ln.strip("=-_ ")]
        found = raised[:1] or said[-1:] or plain[-1:]
        return found[0][:300] if found else f"exit {self.rc}, no output on stderr"

    def refusal(self) -> str | None:
        """The script's own `refused: ...` line (common.refuse, exit 3), or a launcher's
        one-line usage refusal (exit 2, `...: error: ...`); None when it did not refuse."""
        text = Path(self.stderr).read_text(errors="replace")
        for line in text.splitlines():
            at = line.find("refused: ")
            if at >= 0:
                return line[at + len("refused: "):].strip()[:300]
        if self.rc in (2, 3):
            errors = [ln for ln in text.splitlines() if "error:" in ln]
            return (errors[-1] if errors else self.last_line()).strip()[:300]
        return None

    def to_json(self) -> dict:
        return asdict(self)


def clean_env() -> dict[str, str]:
    """This environment less what would make the ranks join another job (a launcher's
    variables, Phalanx's run directory)."""
    return {k: v for k, v in os.environ.items()
            if k not in _FOREIGN and not k.startswith(("TORCHELASTIC_", "PHALANX_"))}


def launch(command: list[str], evidence: Path, name: str,
           timeout_s: float = TIMEOUT_S) -> RunResult:
    """Run `command` to its end (or kill its process group after `timeout_s`), its output
    in `evidence/NAME.stdout|stderr` and `evidence/NAME.json`."""
    evidence.mkdir(parents=True, exist_ok=True)
    out, err = evidence / f"{name}.stdout", evidence / f"{name}.stderr"
    start = time.monotonic()
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen(command, stdout=o, stderr=e, env=clean_env(),
                                start_new_session=True, cwd=Path(__file__).resolve().parents[2])
        try:
            rc: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its ranks: our own group
            proc.wait()
            e.write(f"\nconformance: timed out after {timeout_s:g} s; killed\n")
            rc = None
    result = RunResult(name, command, rc, round(time.monotonic() - start, 2), str(out),
                       str(err))
    (evidence / f"{name}.json").write_text(json.dumps(result.to_json(), indent=1))
    return result
