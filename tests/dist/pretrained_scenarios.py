"""Worker for tests/dist/test_pretrained.py: transformers models (GPT-2 with its tied head,
Llama) set up under each strategy on 2 gloo ranks, each rank's generator drawing its own
initial weights, then filled from a `save_pretrained` directory with `run.load_pretrained`.
Rank 0 saves the gathered weights and the probe's logits to OUT/<model>-<strategy>.pt.
Usage: python pretrained_scenarios.py OUT   (OUT/<model>/ holds each save_pretrained)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import transformers
from sharded_scenarios import using
from transformers_scenarios import MODELS, PROBE

import phalanx

STRATEGIES = ("ddp", "fsdp")


def main(out: Path) -> None:
    transformers.logging.set_verbosity_error()
    with phalanx.init(seed=0, threads=1) as run:
        for name, (cls, config) in MODELS.items():
            for label in STRATEGIES:
                with using(run, label):
                    torch.manual_seed(1000 + run.rank)  # not the files' weights, per rank
                    model = run.setup(cls(config()))
                    run.load_pretrained(model, out / name)
                    model.eval()
                    state = run.full_state_dict(model)
                    with torch.no_grad():
                        logits = model(input_ids=PROBE).logits
                if run.is_main:
                    torch.save({"state": {k: v.clone() for k, v in state.items()},
                                "logits": logits}, out / f"{name}-{label}.pt")
                run.barrier()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
