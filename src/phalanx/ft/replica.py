"""This process as one replica group of a torchft job (`--fault-tolerance torchft`), on the
trainer's loop: `begin_step` (the quorum; a returning group is healed here), `average`
(the gradients over this step's live groups), `commit` (torchft's vote: step only if every
group's all-reduce succeeded).

The data cursor is global, as without torchft: a step with P live groups reads P group
batches, group r of the quorum taking the r-th (`QuorumBatches`), and the cursor moves by
P group batches only when the step commits. With every group alive this reads exactly
what `--strategy ddp` reads on as many ranks, and averages the same gradients, so the
weights are the same bits (on CPU, fp32; tested).

What a healthy group sends a returning one is everything a checkpoint holds: the model,
the optimizer and `TrainState` (step, cursor, tokens). Each step's membership is written
to `OUT/ft-steps.jsonl` with a fingerprint of the weights after the step, so live groups
can be compared step by step (each step once: records from this process's first step on,
left by a continuation that was lost, are dropped when it writes it); changes are also events (`events.jsonl`) and one console
line (said by the quorum's first group).

With `PHALANX_FT_SAMPLES=1` (the tests; nothing is recorded otherwise), each step
*attempt* is also written to `OUT/ft-samples.jsonl`, committed or not: before its
all-reduce, `{"step", "group", "rank", "participants", "samples"}` (the sample indices
this group read, `QuorumBatches.read`); after torchft's vote, `{"step", "committed"}`. A
group killed between the two leaves the first alone. Each process starts the file's part
with `{"dataset_samples": N}`."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import signal
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from phalanx.cluster import protocol
from phalanx.errors import DistributedError, FinishedElsewhere
from phalanx.paths import open_append
from phalanx.report.events import record_event
from phalanx.report.sink import drop_from
from phalanx.strategies.guards import fingerprints, named_state


def _torchft_logs_to_rank_log() -> None:
    """torchft logs each failure it handles with a traceback (a peer gone mid-all-reduce):
    into this rank's log, not the console, where Phalanx says it in one line."""
    logger = logging.getLogger("torchft")
    logger.setLevel(logging.WARNING)
    path = os.environ.get(protocol.RANK_LOG_FILE)
    if path:  # appended without following a link (not logging.FileHandler's by-name open)
        stream = os.fdopen(open_append(path), "a", buffering=1, encoding="utf-8")
        logger.addHandler(logging.StreamHandler(stream))
        logger.propagate = False


class ReplicaGroup:
    """torchft's Manager for one group of one rank, bound to the trainer's state."""

    aims_batches = True  # the trainer's data: QuorumBatches, aimed by begin_step

    def __init__(self, run, dist_cfg, group: str, lighthouse: str, group_batch: int,
                 out_dir: Path | None, max_steps: int = 0) -> None:
        from torchft import ProcessGroupGloo

        from phalanx.ft.bind import bound_manager, listen_host

        self.run, self.group, self.group_batch, self.out_dir = run, group, group_batch, out_dir
        self.max_steps = max_steps  # its last step marks the run finished (StartStore)
        self.lighthouse, self.min_replicas = lighthouse, dist_cfg.min_replicas
        timeout = timedelta(seconds=dist_cfg.timeout_s)
        self.timeout = timedelta(seconds=dist_cfg.rdzv_timeout_s)
        _torchft_logs_to_rank_log()
        # the lighthouse on loopback: so is everything; else the address towards it
        host = listen_host(lighthouse, local=dist_cfg.lighthouse is None)
        try:
            self.manager = bound_manager(
                host, timeout, pg=ProcessGroupGloo(timeout=timeout), load_state_dict=self._load,
                state_dict=self._save, min_replica_size=dist_cfg.min_replicas,
                use_async_quorum=False, rank=run.rank, world_size=run.world_size,
                lighthouse_addr=lighthouse, replica_id=f"phalanx-g{group}",
                quorum_timeout=self.timeout, connect_timeout=self.timeout,
                init_sync=False)  # the same model from the seed
        except RuntimeError as exc:  # torchft's: the lighthouse not reached in time
            raise self._no_lighthouse(exc) from None
        self.result: Any = None
        self.participants, self.rank, self.healed, self.agreed_stop = 0, 0, False, 0
        self.start: StartStore | None = None
        self.recording = False  # ft-steps.jsonl trimmed to this process's first step
        self.batches: Any = None
        self.samples = open_append(Path(out_dir) / "ft-samples.jsonl") if out_dir is not None \
            and run.is_main and os.environ.get(protocol.FT_SAMPLES) == "1" else None  # (tests)

    def attach(self, result: Any) -> None:
        """Bind to the trainer's model, optimizer and state (restored from a checkpoint or
        new); torchft's step counter starts where the state is; then meet the others."""
        self.result = result
        self._count_from(result.state)
        self.start = StartStore.from_env(self.timeout)
        if self.start is not None:
            self.start.meet(self.group, self.run.print)

    def _finished_elsewhere(self) -> None:
        """Raise FinishedElsewhere when another group of this launch has finished the run
        (marked at its last step): a group restarted after it would quorum alone and
        train a new run from its own step."""
        winner = None if self.start is None else self.start.finished_by()
        if winner is not None and winner != self.group:
            raise FinishedElsewhere(self.group, winner)

    def begin_step(self, batches: Any) -> None:
        """The quorum for the next step (healing this group first if it is behind), then
        aim the data at this group's place in it."""
        assert self.result is not None
        self.healed = False
        self._finished_elsewhere()
        try:
            with warnings.catch_warnings():  # torch's note on the state it receives
                warnings.filterwarnings("ignore", message="The given buffer is not writable")
                self.manager.start_quorum()
        except Exception as exc:  # noqa: BLE001 - torchft raises plain errors
            raise self._no_lighthouse(exc) from None
        participants = self.manager.num_participants()
        self.rank = self.manager.participating_rank() or 0
        step = self.result.state.step + 1
        if self.healed:
            self._record("heal", step, f"step {step}: group {self.group} rejoined: its "
                         "weights, optimizer state and data cursor copied from a live group",
                         console=True)
        if participants != self.participants:
            self._record("membership", step, f"step {step}: {participants} replica group"
                         f"{'s' if participants > 1 else ''} live (global batch "
                         f"{participants * self.group_batch} sequences)",
                         console=self.rank == 0)  # one line per change: the first group's
        self.participants = participants
        batches.aim(self.result.state.position, self.rank, participants)
        if self.samples is not None and self.batches is None:
            self._sampled({"dataset_samples": len(batches.dataset)})
        self.batches = batches

    def _no_lighthouse(self, exc: Exception) -> DistributedError:
        return DistributedError(
            f"replica group {self.group}: no quorum from the lighthouse at "
            f"{self.lighthouse} within {self.timeout.total_seconds():g} s "
            f"({str(exc).splitlines()[0][:200]}). Is it running, and are at least "
            f"--min-replicas {self.min_replicas} group(s) alive?", [self.run.rank])

    def average(self, model: nn.Module, loss: torch.Tensor) -> torch.Tensor:
        """Every gradient, the loss and a job-wide stop request averaged over this step's
        live groups in one all-reduce, so that the NaN guard and a stop of the whole job
        decide alike in every group. Returns the mean loss (what ddp logs)."""
        if self.samples is not None:  # before the all-reduce: what this attempt adds to it
            self._sampled({"step": self.result.state.step + 1, "group": self.group,
                           "rank": self.rank, "participants": self.participants,
                           "samples": self.batches.read})
        params = [p for p in model.parameters() if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        dtype = grads[0].dtype if grads else torch.float32
        here = self.run.stop_signal_here()
        wide = float(bool(here) and self.start is not None and self.start.job_stopped())
        extra = torch.stack([loss.detach().to(dtype),
                             torch.full((), wide, dtype=dtype, device=loss.device)])
        flat = torch.cat([*(g.reshape(-1) for g in grads), extra])
        self.manager.allreduce(flat).wait()
        offset = 0
        for p, g in zip(params, grads):  # the averaged gradients: views of the one buffer
            n = g.numel()
            p.grad = flat[offset:offset + n].view_as(g)
            offset += n
        # the job is stopping (its launcher's signal, seen by any group): all stop after this
        # step; a signal to this group alone (its machine preempted): it alone leaves
        self.agreed_stop = (here or int(signal.SIGTERM)) if float(flat[-1]) > 0 else here
        return flat[-2].clone()

    def commit(self) -> bool:
        """torchft's vote: True when every live group's step went through."""
        committed = self.manager.should_commit()
        if self.samples is not None:
            self._sampled({"step": self.result.state.step + 1, "committed": committed})
        return committed

    def stop(self, run) -> int:
        """The stop every live group agreed at this step's all-reduce (0: none)."""
        return self.agreed_stop

    @property
    def val_world(self) -> int:
        """Whose val shares this group evaluates, alone (train.loop.evaluate): every rank's
        of the ddp run on as many ranks as its launch started groups, so that the val loss
        is that run's whichever groups are live (a group started by hand: its own)."""
        return len(self.start.names) if self.start is not None else 1

    @property
    def global_batch(self) -> int:
        return self.participants * self.group_batch

    def stepped(self, model: nn.Module) -> None:
        """After a committed step: its membership and a fingerprint of the weights. The
        last step marks the run finished at once, before the outputs are written: a group
        restarted meanwhile would quorum alone and train on (see _finished_elsewhere)."""
        if self.start is not None and self.result.state.step >= self.max_steps > 0:
            self.start.finish(self.group)
        if self.out_dir is None or not self.run.is_main:
            return
        # on the model's device, one copy back (not one per tensor: a sync each on a GPU)
        _, rows = fingerprints(named_state(model), self.run.device)
        rows = rows.cpu()
        line = {"step": self.result.state.step, "group": self.group,
                "participants": self.participants, "rank": self.rank,
                "global_batch": self.global_batch, "healed": self.healed,
                "torchft_step": self.manager.current_step(),  # (the same, or a bug)
                "fingerprint": hashlib.sha256(rows.numpy().tobytes()).hexdigest()[:16]}
        path = Path(self.out_dir) / "ft-steps.jsonl"
        if not self.recording:  # this process's first step: what the file holds from it on
            drop_from(path, line["step"])  # is a continuation that was lost (a resume from
            self.recording = True  # an older checkpoint), as metrics.jsonl drops it
        fd = open_append(path)  # a link there: refused
        with os.fdopen(fd, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")

    def rolled_back(self, state: Any) -> None:
        """`--on-nan rollback`: every live group saw the same non-finite mean loss and
        reloaded its newest checkpoint — the same step in every group that has taken
        every checkpoint since the last join; torchft's step counter follows, so that at
        the next quorum a group that rolled back further (its newest checkpoint older:
        it rejoined since) is healed from the others, and ft-steps.jsonl is rewritten
        from there on."""
        self._count_from(state)
        self.recording = False

    def _count_from(self, state: Any) -> None:
        """torchft's step counter (and its batches) set to the trainer's state."""
        self.manager.load_state_dict({"step": state.step,
                                      "batches_committed": state.position // self.group_batch})

    def _sampled(self, line: dict[str, Any]) -> None:
        assert self.samples is not None
        os.write(self.samples, (json.dumps(line) + "\n").encode())  # one write: whole lines

    def shutdown(self) -> None:
        self.manager.shutdown(wait=False)
        if self.samples is not None:
            os.close(self.samples)

    def _record(self, kind: str, step: int, text: str, console: bool) -> None:
        if self.run.is_main:
            record_event(self.out_dir, kind, step, text)
        if console:
            self.run.print(f"phalanx: {text}")

    # -- what a healthy group sends, what a returning one loads -----------------------
    def _save(self) -> dict[str, Any]:
        assert self.result is not None
        r = self.result
        scaler = self.run.loss_scaler  # fp16's (None in fp32 and bf16)
        return {"model": self.run.unwrap(r.model).state_dict(),
                "optimizer": r.optimizer.state_dict(),
                "train": dataclasses.asdict(r.state),
                "scaler": scaler.state_dict() if scaler is not None else None}

    def _load(self, state: dict[str, Any]) -> None:
        assert self.result is not None
        self.run.checkpoint_staged()  # a heal writes the weights a background save copies
        r = self.result
        self.run.unwrap(r.model).load_state_dict(state["model"])
        r.optimizer.load_state_dict(state["optimizer"])
        for key, value in state["train"].items():
            setattr(r.state, key, value)
        scaler = self.run.loss_scaler  # fp16's (None in fp32 and bf16)
        if scaler is not None:  # fp16: the loss scale and its growth count, as the live
            scaler.load_state_dict(state["scaler"])  # groups have them
        self.healed = True


class StartStore:
    """The store of a one-machine launch (`phalanx.ft.groups`): where the groups meet
    before their first quorum, and where the launcher marks a stop of the whole job."""

    STOP = "phalanx-ft-job-stop"
    FINISHED = "phalanx-ft-run-finished"  # the group that finished the run

    def __init__(self, host: str, port: int, names: list[str], timeout: timedelta) -> None:
        from torch.distributed import TCPStore

        self.names, self.timeout = names, timeout
        self.store = TCPStore(host, port, is_master=False, timeout=timeout)

    @classmethod
    def from_env(cls, timeout: timedelta) -> StartStore | None:
        found = os.environ.get(protocol.FT_START)
        if found is None:  # a group started by hand, not by its launcher
            return None
        host, port, names = found.split(":", 2)
        return cls(host, int(port), names.split(","), timeout)

    def meet(self, group: str, say) -> None:
        """At each start of a group (a launch, or its agent's restart): wait until every
        group of this launch has started (or ended: its launcher marks it), up to
        --rdzv-timeout-s, so that the first quorum of a launch holds them all — else the
        first group up would take steps alone and the others join by healing, another
        run. A group restarted mid-run finds the others' marks at once."""
        self.store.set(started_key(group), "1")
        try:
            self.store.wait([started_key(n) for n in self.names], self.timeout)
        except Exception:  # noqa: BLE001 - the store's timeout: go on with those that came
            say(f"phalanx: warning: not every replica group started within "
                f"{self.timeout.total_seconds():g} s; going on with those that did")

    def job_stopped(self) -> bool:
        return self.store.check([self.STOP])

    def finish(self, group: str) -> None:
        """Group GROUP took the run's last step (the first to say so is kept)."""
        if not self.store.check([self.FINISHED]):
            self.store.set(self.FINISHED, group)

    def finished_by(self) -> str | None:
        """The group that finished the run (marked at its last step, or by the launcher
        once it exited 0)."""
        if not self.store.check([self.FINISHED]):
            return None
        return self.store.get(self.FINISHED).decode()


def started_key(group: str) -> str:
    return f"phalanx-ft-started-{group}"
