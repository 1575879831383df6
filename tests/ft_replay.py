"""The reference for a torchft run with failures: the same trainer, in one process, fed
the membership the run recorded (`OUT/replica-G/ft-steps.jsonl`). At a step with P live
groups it computes group r's gradient on group r's batch for r = 0 .. P-1 (seeded as
that group), sums them in rank order and divides by P — what torchft's all-reduce did —
then steps as the trainer does. Weights equal to the run's, bit for bit, mean every step
of the run read the samples its membership says and averaged over exactly those groups."""

from __future__ import annotations

import json
from pathlib import Path

import torch

import phalanx
from phalanx.config.sections import build_config
from phalanx.data.corpus import prepare_data
from phalanx.train.loop import train


def recorded(replica: Path) -> dict[int, int]:
    """{step: live groups} from a group's ft-steps.jsonl."""
    lines = [json.loads(line) for line in (replica / "ft-steps.jsonl").read_text().splitlines()]
    return {line["step"]: line["participants"] for line in lines}


class Replay:
    aims_batches = True
    healed = False

    def __init__(self, run, members: dict[int, int], group_batch: int) -> None:
        self.run, self.members, self.group_batch = run, members, group_batch
        self.rank, self.participants = 0, 1

    def attach(self, result) -> None:
        self.result = result

    def begin_step(self, batches) -> None:
        s = self.result.state
        self.participants = self.members[s.step + 1]
        self.batches = batches
        batches.aim(s.position, 0, self.participants)

    def average(self, model, loss):
        params = [p for p in model.parameters() if p.requires_grad]
        total = torch.cat([p.grad.reshape(-1) for p in params])
        s = self.result.state
        for r in range(1, self.participants):
            for p in params:
                p.grad = None
            self.run.seed_step(s.step, r)
            self.batches.aim(s.position, r, self.participants)
            x, y = next(self.batches)
            _, loss = model(x, y)
            loss.backward()
            total = total + torch.cat([p.grad.reshape(-1) for p in params])
        total /= self.participants
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = total[offset:offset + n].view_as(p).clone()
            offset += n
        return loss  # (logged only; the run's losses are finite)

    def commit(self) -> bool:
        return True

    def stop(self, run) -> int:
        return 0

    @property
    def global_batch(self) -> int:
        return self.participants * self.group_batch

    def stepped(self, model) -> None:
        pass

    def shutdown(self) -> None:
        pass


def replay(replica: Path) -> dict[str, torch.Tensor]:
    """The reference weights for the run whose group wrote `replica` (OUT/replica-G)."""
    cfg = build_config(json.loads((replica / "run_config.json").read_text()))
    t = cfg.train
    with phalanx.init(seed=t.seed, threads=1) as run:
        gate = Replay(run, recorded(replica), t.micro_batch_size * t.grad_accum)
        result = train(cfg, run, prepare_data(cfg.data, log=lambda line: None), gate=gate)
        return {k: v.detach().clone() for k, v in run.unwrap(result.model).state_dict().items()}
