"""Fault injection, to test recovery the way it will really be exercised.

`PHALANX_FAULT="rank=1,step=7,phase=step,action=kill,attempts=first"` makes rank 1 die
(SIGKILL) after optimizer step 7 — or, with `phase=checkpoint`, while writing the
checkpoint of step 7, before its data is on disk. `action=raise` raises instead;
`action=hang` enters a barrier that no other rank joins (a planted deadlock);
`action=perturb` adds 1e-3 to this replica's first parameter (a diverged replica);
`action=nan` makes this rank's next loss NaN (the NaN guard's test);
`action=spike` multiplies this rank's next loss by 20 (the spike warning's test);
`action=slow` makes this rank slower from then on (a straggler): by `ms=` milliseconds
(default 40) at `where=` — `forward` (default: each forward), `data` (each batch the
trainer's micro-steps take), `optimizer` (each optimizer step's `step()`: under ZeRO the
inner optimizer's too) or `between` (after each step, outside it);
`action=pause` says `phalanx-fault: pause at PHASE STEP` on stderr and sleeps 2 s there
(a window for a signal to land in: the Ctrl-C stress test); `action=hold` says
`phalanx-fault: hold at PHASE STEP` and waits there until the file named by
PHALANX_FAULT_RELEASE exists (at most 10 minutes): a test acts while the run is known to be
mid-run, on a machine of any speed, and then lets it go on. Phases: `step` (after the
optimizer step), `checkpoint` (while writing it), `eval` (as evaluation starts),
`export` (as the final outputs are written).
`attempts=always` fires on every elastic restart too (a rank that always fails),
`attempts=first` (default) only before the first restart, `attempts=N` only on restart
N. A fault fires once per process (`times=N`: up to N times, when `--on-nan rollback`
brings the run back to its step). Several faults are separated by `;`. Unset: nothing
happens.
"""

from __future__ import annotations

import os
import signal

from phalanx.cluster import protocol
from phalanx.cluster.rendezvous import restart_attempt
from phalanx.errors import UserError


class InjectedFault(RuntimeError):
    """The error `action=raise` raises."""


_CHOICES = {"phase": ("step", "checkpoint", "eval", "export"),
            "action": ("kill", "raise", "hang", "perturb", "nan", "spike", "slow", "pause", "hold"),
            "where": ("forward", "data", "optimizer", "between")}
_KEYS = {"rank", "step", "phase", "action", "attempts", "times", "where", "ms"}


def _specs() -> list[dict[str, str]]:
    """The faults PHALANX_FAULT asks for, each checked (a UserError naming what is off)."""
    raw = os.environ.get(protocol.FAULT)
    if not raw:
        return []
    specs = []
    for one in raw.split(";"):
        try:
            spec = dict(item.split("=", 1) for item in one.split(","))
        except ValueError:
            spec = {}
        spec = {"phase": "step", "action": "kill", "attempts": "first", "times": "1",
                "where": "forward", "ms": "40", **spec}
        specs.append(spec)
        if not _valid(spec):
            raise UserError(f"PHALANX_FAULT=`{raw}` is malformed at `{one}`; expected e.g. "
                            f"`rank=1,step=7,phase=step,action=kill` (phase: {'|'.join(_CHOICES['phase'])}; "
                            f"action: {'|'.join(_CHOICES['action'])}; attempts: first|always|N; times: N; "
                            f"where: {'|'.join(_CHOICES['where'])}; ms: N).")
    return specs


def _valid(spec: dict[str, str]) -> bool:
    return (set(spec) == _KEYS and spec["rank"].isdigit() and spec["step"].isdigit()
            and spec["times"].isdigit() and spec["ms"].isdigit()
            and all(spec[k] in v for k, v in _CHOICES.items())
            and (spec["attempts"] in ("first", "always") or spec["attempts"].isdigit()))


def check_faults() -> None:
    """Refuse a malformed PHALANX_FAULT, or an action=hold without
    PHALANX_FAULT_RELEASE, before any worker starts."""
    if any(spec["action"] == "hold" for spec in _specs()) and \
            not os.environ.get(protocol.FAULT_RELEASE):
        raise UserError(f"{protocol.FAULT} asks for action=hold but {protocol.FAULT_RELEASE} "
                        "is not set; set it to the path of the file whose creation ends the "
                        "hold.")


def injected() -> str | None:
    """PHALANX_FAULT's value, checked (a malformed one: UserError), or None when unset.
    A value left exported in a shell acts on every step, save and export: `announce`
    says it, `environment.json` records it under "PHALANX_FAULT", the events say it."""
    check_faults()
    return os.environ.get(protocol.FAULT) or None


def announcement(value: str) -> str:
    return f"phalanx: {protocol.FAULT} is set (fault injection): {value}"


def announce() -> str | None:
    """Check PHALANX_FAULT and, when set, print its one line — once per job: the launcher
    says it and its ranks (which inherit FAULT_ANNOUNCED) do not; a rank without one
    says it itself (rank 0). The value, or None."""
    value = injected()
    if value is None or os.environ.get(protocol.FAULT_ANNOUNCED) == value:
        return value
    if os.environ.get("RANK", "0") == "0":
        print(announcement(value), flush=True)
    os.environ[protocol.FAULT_ANNOUNCED] = value
    return value


def _this_attempt(attempts: str) -> bool:
    attempt = str(restart_attempt())
    return attempts == "always" or attempt == {"first": "0"}.get(attempts, attempts)


_FIRED: dict[str, int] = {}  # this process's count per fault (test instrumentation)
_SLOWED: dict[str, float] = {}  # action=slow: where → seconds added there, from then on


def slow_point(where: str) -> None:
    """Where a planted slowness may be added (`data`: the loader; `between`: the step's
    fault point; the others hook torch)."""
    if where in _SLOWED:
        import time

        time.sleep(_SLOWED[where])


def fault_point(phase: str, step: int, model=None) -> None:
    """Fire the configured fault if this rank, step, phase and attempt match."""
    if phase == "step":
        slow_point("between")
    for spec in _specs():
        if (spec["phase"] == phase and int(spec["step"]) == step
                and int(spec["rank"]) == int(os.environ.get("RANK", "0"))
                and _this_attempt(spec["attempts"])):
            key = repr(sorted(spec.items()))
            if _FIRED.get(key, 0) >= int(spec["times"]):
                continue
            _FIRED[key] = _FIRED.get(key, 0) + 1
            if spec["action"] == "slow":
                _slow(spec["where"], int(spec["ms"]) / 1e3, model)
            else:
                _fire(spec["action"], phase, step, model)  # phalanx: ignore[PX303] (planted)


def _slow(where: str, seconds: float, model) -> None:
    import time

    if where in _SLOWED:
        return
    _SLOWED[where] = seconds
    if where == "forward":
        model.register_forward_pre_hook(lambda _module, _inputs: slow_point("forward"))
    elif where == "optimizer":
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        register_optimizer_step_pre_hook(lambda *_: time.sleep(seconds))


def _fire(action: str, phase: str, step: int, model) -> None:
    if action == "raise":
        raise InjectedFault(f"injected fault at step {step} ({phase})")
    if action == "hang":
        import torch.distributed as dist

        dist.barrier()  # no other rank comes: the hang watchdog's test
    elif action in ("nan", "spike"):  # the next forward's loss on this rank (once)
        factor = float("nan") if action == "nan" else 20.0

        def poison(_module, _inputs, output):
            handle.remove()
            logits, loss = output
            return logits, loss * factor

        handle = model.register_forward_hook(poison)
    elif action == "pause":
        import sys
        import time

        print(f"phalanx-fault: pause at {phase} {step}", file=sys.stderr, flush=True)
        time.sleep(2.0)
    elif action == "hold":
        _hold(phase, step)
    elif action == "perturb":
        import torch

        with torch.no_grad():
            next(model.parameters()).add_(1e-3)
    else:
        os.kill(os.getpid(), signal.SIGKILL)


def _hold(phase: str, step: int) -> None:
    """Wait here until PHALANX_FAULT_RELEASE's file exists (at most 10 minutes)."""
    import sys
    import time
    from pathlib import Path

    release = Path(os.environ.get(protocol.FAULT_RELEASE, ""))  # (checked: check_faults)
    print(f"phalanx-fault: hold at {phase} {step}", file=sys.stderr, flush=True)
    deadline = time.monotonic() + 600
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not release.exists():
        print(f"phalanx-fault: hold at {phase} {step}: {release} not made in 600 s; going on",
              file=sys.stderr, flush=True)
