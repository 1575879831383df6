"""The reference for a torchft run with failures: the same trainer, in one process, fed
the membership the run recorded (`OUT/replica-G/ft-steps.jsonl`). At a step with P live
groups it computes group r's gradient on group r's batch for r = 0 .. P-1 (seeded as
that group), sums them in rank order and divides by P — what torchft's all-reduce did —
then steps as the trainer does. Weights equal to the run's, bit for bit, mean every step
of the run read the samples its membership says and averaged over exactly those groups.

That proof shares the trainer's loop, the quorum's batch selection and the cursor with the
run. `each_sample_once` does not: from the sample indices each group recorded at each
step attempt (`PHALANX_FT_SAMPLES=1`: OUT/replica-G/ft-samples.jsonl) and the global
order written down here (`global_order`), it checks that the committed steps read the
order's prefix, each sample once, and that every attempt that did not commit was read
again later."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import torch

import phalanx
from phalanx.config.sections import build_config
from phalanx.data.corpus import prepare_data
from phalanx.ft.gate import NoReplicas
from phalanx.train.loop import train


def recorded(replica: Path) -> dict[int, int]:
    """{step: live groups} from a group's ft-steps.jsonl."""
    lines = [json.loads(line) for line in (replica / "ft-steps.jsonl").read_text().splitlines()]
    return {line["step"]: line["participants"] for line in lines}


class Replay(NoReplicas):
    """torchft's gate replayed in one process: each recorded step's live groups' gradients
    summed in rank order. What it does not replay comes from NoReplicas (evaluation of
    its own val share, which leaves the weights alone; no rollback: its losses are
    finite)."""

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



def replay(replica: Path) -> dict[str, torch.Tensor]:
    """The reference weights for the run whose group wrote `replica` (OUT/replica-G)."""
    cfg = build_config(json.loads((replica / "run_config.json").read_text()))
    t = cfg.train
    with phalanx.init(seed=t.seed, threads=1) as run:
        gate = Replay(run, recorded(replica), t.micro_batch_size * t.grad_accum)
        result = train(cfg, run, prepare_data(cfg.data, log=lambda line: None), gate=gate)
        return {k: v.detach().clone() for k, v in run.unwrap(result.model).state_dict().items()}


def global_order(n: int, seed: int, count: int) -> list[int]:
    """The first `count` samples of a run's global order, from its definition (not from
    Phalanx's sampler): position p of the stream is sample perm_e[p mod n] of a dataset of
    n, e = p div n its epoch, perm_e = torch.randperm(n) drawn from a CPU generator seeded
    seed * 1,000,003 + e (`--seed`)."""
    order: list[int] = []
    for epoch in range(-(-count // n)):
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        order += torch.randperm(n, generator=g).tolist()
    return order[:count]


def attempts(replica: Path) -> tuple[int, list[dict]]:
    """(samples in the dataset, this group's step attempts in order), from its
    ft-samples.jsonl: each attempt with its samples and `committed` (None: the group was
    killed between its all-reduce and the vote — its process's last attempt)."""
    n, out = 0, []
    for rec in map(json.loads, (replica / "ft-samples.jsonl").read_text().splitlines()):
        if "dataset_samples" in rec:  # a (re)started process
            n = rec["dataset_samples"]
            if out and out[-1]["committed"] is None:
                out[-1]["killed"] = True
        elif "samples" in rec:
            assert not out or out[-1]["committed"] is not None or out[-1].get("killed"), \
                (replica, out[-1], rec)
            out.append({**rec, "committed": None})
        else:
            assert out[-1]["step"] == rec["step"] and out[-1]["committed"] is None, rec
            out[-1]["committed"] = rec["committed"]
    return n, out


def each_sample_once(replicas: list[Path]) -> tuple[int, int]:
    """Assert that the committed step attempts of every group, step by step, read the
    global order's next samples (as a set per step: gap-free, no repeats), each step's
    live groups one slice each; and that the samples of every attempt that did not commit
    are among the positions its step started at, read later by committed steps. Returns
    (committed steps, attempts not committed). The live groups of each committed step
    are also those the first group's ft-steps.jsonl (the replay's membership) names."""
    members = recorded(replicas[0])
    seed = build_config(json.loads((replicas[0] / "run_config.json").read_text())).train.seed
    found = {r.name: attempts(r) for r in replicas}
    (n,) = {size for size, _ in found.values()}
    every = [a for _, group in found.values() for a in group]
    for a in every:  # killed in the vote: it counted where the others' vote at that
        if a["committed"] is None:  # step and quorum size committed
            assert a.get("killed"), a
            a["committed"] = any(b["committed"] for b in every if b is not a and (
                b["step"], b["participants"]) == (a["step"], a["participants"]))
    steps: dict[int, list[dict]] = defaultdict(list)
    for a in every:
        if a["committed"]:
            steps[a["step"]].append(a)
    assert sorted(steps) == list(range(1, len(steps) + 1)), sorted(steps)
    order = global_order(n, seed, sum(len(a["samples"]) for s in steps.values() for a in s))
    start, cursor = {}, 0
    for step in sorted(steps):
        slices = sorted(steps[step], key=lambda a: a["rank"])
        assert [a["rank"] for a in slices] == list(range(slices[0]["participants"])) and \
            {a["participants"] for a in slices} == {len(slices)} and \
            members.get(step, len(slices)) == len(slices), (step, members.get(step), slices)
        read = sorted(i for a in slices for i in a["samples"])
        want = order[cursor:cursor + len(read)]
        assert read == sorted(want), f"step {step}: committed samples {read}, the global " \
            f"order's positions {cursor}..{cursor + len(read) - 1} are {sorted(want)}"
        start[step], cursor = cursor, cursor + len(read)
    failed = [a for a in every if not a["committed"]]
    for a in failed:  # its step's positions [c, c + P x its slice), all committed later
        c, span = start[a["step"]], a["participants"] * len(a["samples"])
        assert c + span <= cursor and not Counter(a["samples"]) - Counter(
            order[c:c + span]), f"uncommitted {a}: not read again from position {c} on"
    return len(steps), len(failed)
