"""Phalanx: PyTorch data-parallel training, correct by construction.

    import phalanx
    run = phalanx.init(seed=0)                       # rank, device, backend, process group
    model, opt = run.setup(model, lambda p: torch.optim.AdamW(p))   # place → wrap → optimizer
    loader = run.loader(dataset, batch_size=16)     # sharded, reshuffled every epoch
    acc = run.accumulate(model, steps=4)            # no gradient sync but on the last
"""

from __future__ import annotations

from phalanx.version import __version__

__all__ = ["Run", "init", "__version__"]


def __getattr__(name: str):
    # Lazy: `phalanx --help` and config errors must not pay for `import torch`.
    if name == "Run":
        from phalanx.runtime.run import Run

        return Run
    if name == "init":
        from phalanx.runtime.init import init

        return init
    raise AttributeError(f"module 'phalanx' has no attribute {name!r}")
