"""Every rank trains the same run: at start, ranks compare their resolved configuration.

Hosts started with different flags (`--lr 2e-3` on one, `1e-3` on the other, another
`--seed`) would otherwise train a wrong model silently — DDP averages gradients of
models that follow different rules — or fail later in a traceback that never names the
flag (`--n-embd`: a shape check inside DDP; `--max-steps`: a collective one rank never
joins). One small all-gather of a digest at start; only when digests differ are the
configurations themselves gathered (as JSON in byte tensors: nothing is unpickled), and
every rank raises the same one-line error naming the flags, values, ranks and hosts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import socket
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from phalanx.config.sections import SECTIONS, Config, flag_of
from phalanx.errors import UserError

if TYPE_CHECKING:
    from phalanx.data.corpus import TokenSplits
    from phalanx.runtime.run import Run

# what may differ between hosts: where each keeps its files, its own place in the job,
# its cores; the token data and tokenizer are compared by sizes instead of by path
PER_HOST = frozenset({"data.path", "data.cache_dir", "data.tokenizer", "train.out",
                      "train.resume", "dist.node_rank", "dist.rdzv_endpoint",
                      "dist.threads_per_rank", "dist.tee_ranks", "dist.nccl_preset"})
DATA_SIZES = (("data.train_tokens", "the training split of `--data` (tokens)"),
              ("data.val_tokens", "the validation split of `--data` (tokens)"),
              ("data.vocab_size", "the vocabulary of `--tokenizer`"))


def _flag(key: str) -> str:
    """`train.lr` → "`--lr`" (the spelling a user typed)."""
    section, _, name = key.partition(".")
    for f in dataclasses.fields(SECTIONS[section]) if section in SECTIONS else ():
        if f.name == name:
            return f"`{flag_of(f)}`"
    return dict(DATA_SIZES).get(key, key)


def shared_settings(cfg: Config, splits: TokenSplits | None = None) -> dict[str, object]:
    """The settings every rank must agree on, as `section.field` → value."""
    flat = {f"{section}.{name}": value for section, fields in cfg.to_dict().items()
            for name, value in fields.items() if f"{section}.{name}" not in PER_HOST}
    if splits is not None:
        flat["data.train_tokens"], flat["data.val_tokens"] = splits.n_train, splits.n_val
        flat["data.vocab_size"] = splits.vocab_size
    return flat


def check_agreement(run: Run, cfg: Config, splits: TokenSplits | None = None) -> None:
    """A collective (every rank, at start): UserError on every rank when ranks differ."""
    if run.world_size == 1:
        return
    mine = shared_settings(cfg, splits)
    blob = json.dumps({"host": socket.gethostname(), "settings": mine},
                      sort_keys=True, default=str).encode()
    digest = torch.tensor(list(hashlib.sha256(json.dumps(mine, sort_keys=True, default=str)
                                               .encode()).digest()), dtype=torch.uint8,
                          device=run.device)  # NCCL groups gather device tensors only
    digests = [torch.empty_like(digest) for _ in range(run.world_size)]
    dist.all_gather(digests, digest)
    if all(torch.equal(d, digests[0]) for d in digests):
        return
    records = [json.loads(b) for b in _gather_bytes(run, blob)]
    raise UserError(disagreement(records))


def _gather_bytes(run: Run, blob: bytes) -> list[bytes]:
    size = torch.tensor([len(blob)], dtype=torch.int64, device=run.device)
    sizes = [torch.empty_like(size) for _ in range(run.world_size)]
    dist.all_gather(sizes, size)
    longest = max(int(s) for s in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8)
    mine[:len(blob)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    mine = mine.to(run.device)
    every = [torch.empty_like(mine) for _ in range(run.world_size)]
    dist.all_gather(every, mine)
    return [bytes(t[:int(n)].cpu().tolist()) for t, n in zip(every, sizes)]


def disagreement(records: list[dict]) -> str:
    """`ranks disagree on the run's settings: `--lr` is 0.002 on rank 0 (host a), 0.001 on
    rank 1 (host b); …` — each differing setting, its values and who holds them."""
    keys = sorted({k for r in records for k in r["settings"]})
    parts = []
    for key in keys:
        values = [r["settings"].get(key) for r in records]
        if len({json.dumps(v, default=str) for v in values}) == 1:
            continue
        groups: dict[str, list[int]] = {}
        for rank, value in enumerate(values):
            groups.setdefault(json.dumps(value, default=str), []).append(rank)
        held = ", ".join(f"{value} on {_who(ranks, records)}" for value, ranks in groups.items())
        parts.append(f"{_flag(key)} is {held}")
    return ("the ranks were started with different settings: " + "; ".join(parts)
            + ". Every host must run the same command and TOML (only paths, `--node-rank` "
              "and threads may differ); start them again with the same settings.")


def _who(ranks: list[int], records: list[dict]) -> str:
    hosts = sorted({records[r]["host"] for r in ranks})
    span = (f"rank {ranks[0]}" if len(ranks) == 1 else
            f"ranks {ranks[0]}-{ranks[-1]}" if ranks == list(range(ranks[0], ranks[-1] + 1))
            else "ranks " + ",".join(map(str, ranks)))
    return f"{span} ({', '.join(hosts)})"
