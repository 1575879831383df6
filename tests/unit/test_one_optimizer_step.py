"""One optimizer step (issue 42): the trainer's `optimizer_step` goes through the public
`run.clip_grad_norm_` and `run.step`, so "skipped" has one definition — the parameters did
not move (`run.step`'s answer: fp16's scaler skipped an overflow) — and the NaN guard's
drop is the one case that bypasses the step, said as `dropped`."""

from __future__ import annotations

import pytest
import torch

from phalanx.runtime.train_step import optimizer_step


@pytest.fixture
def run(monkeypatch):
    import phalanx

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "PHALANX_RUN_DIR"):
        monkeypatch.delenv(name, raising=False)
    run = phalanx.init(seed=0, threads=1)
    yield run
    run.close()


def _setup(run, precision: str):
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 1)
    return run.setup(net, lambda p: torch.optim.SGD(p, lr=0.1), precision=precision)


def _backward(model, scale: float = 1.0, scaler=None) -> None:
    loss = model(torch.ones(2, 4)).sum().mul(scale)
    (loss if scaler is None else scaler.scale(loss)).backward()


def test_the_trainer_steps_through_run_step(run, monkeypatch):
    model, opt = _setup(run, "fp32")
    calls = []
    real = type(run).step
    monkeypatch.setattr(type(run), "step",
                        lambda self, o, **k: calls.append(o) or real(self, o, **k))
    before = [p.detach().clone() for p in model.parameters()]
    _backward(model)
    done = optimizer_step(run, model, opt, grad_clip=1.0)
    assert calls == [opt] and done.stepped and not done.dropped
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert run.optimizer_steps == 1


def test_an_fp16_overflow_is_not_stepped_and_a_guard_drop_is_dropped(run):
    model, opt = _setup(run, "fp16")
    _backward(model, float("inf"), run.precision.scaler)
    overflow = optimizer_step(run, model, opt, grad_clip=1.0, check=lambda norm: True)
    assert not overflow.stepped and not overflow.dropped  # fp16: the scaler's skip, unasked
    model32, opt32 = _setup(run, "fp32")
    _backward(model32)
    before = [p.detach().clone() for p in model32.parameters()]
    dropped = optimizer_step(run, model32, opt32, grad_clip=1.0, check=lambda norm: True)
    assert dropped.dropped and not dropped.stepped
    assert all(torch.equal(a, b) for a, b in zip(before, model32.parameters()))
    assert all(p.grad is None for p in model32.parameters())
    assert run.optimizer_steps == 2  # each counts one step, as run.step counts it
