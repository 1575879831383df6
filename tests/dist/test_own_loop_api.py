"""The Run API's loop pieces in a one-process world (in this test process): the loader's
cursor (honoured in both modes, refused when the data changed), iterable datasets
batched as they shard themselves (their sampler options and unsavable states refused in
one line), and precision through the API equal to torch's own recipe."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch.utils.data import IterableDataset, TensorDataset

import phalanx
from phalanx.errors import UserError


@pytest.fixture
def run():
    with phalanx.init(seed=3, threads=1) as r:
        yield r


def _ids(loader) -> list[int]:
    return [int(i) for (b,) in loader for i in b]


def test_position_is_honoured_in_epoch_mode(run):
    data = TensorDataset(torch.arange(20))
    full = run.loader(data, batch_size=4)
    _, second = _ids(full), _ids(full)
    assert full.position == 40
    later = run.loader(data, batch_size=4, position=28)  # epoch 1, offset 8
    assert (len(later), later.remaining) == (5, 3) and _ids(later) == second[8:]
    assert _ids(later) == _ids(run.loader(data, batch_size=4, position=40))


def test_the_cursor_counts_the_batches_handed_out_not_those_fetched_ahead(run):
    data = TensorDataset(torch.arange(40))
    # a spawned worker: a worker forked from this test process (threads of earlier tests
    # alive in it) segfaulted once in CI's full run — fork after threads, not the cursor
    loader = run.loader(data, batch_size=4, num_workers=1, multiprocessing_context="spawn")
    it = iter(loader)
    next(it), next(it)
    assert loader.state_dict()["position"] == 8
    again = run.loader(data, batch_size=4)
    again.load_state_dict(loader.state_dict())
    assert _ids(again) == [int(i) for (b,) in it for i in b]


@pytest.mark.parametrize("change, found", [
    ({"num_samples": 99}, "samples in the dataset = 99, and this loader has 20"),
    ({"seed": 1}, "the loader's seed = 1, and this loader has 3"),
    ({"shuffle": False}, "shuffle = False, and this loader has True")])
def test_a_changed_dataset_or_order_is_refused_on_resume(run, change, found):
    loader = run.loader(TensorDataset(torch.arange(20)), batch_size=4)
    state = {**loader.state_dict(), **change}
    with pytest.raises(UserError, match=found):
        loader.load_state_dict(state)


def test_a_resume_without_the_loader_cursor_is_refused_not_ignored(run, tmp_path):
    model, opt = run.setup(nn.Linear(2, 1), lambda p: torch.optim.SGD(p, lr=0.1))
    loader = run.loader(TensorDataset(torch.randn(8, 2)), batch_size=2)
    run.save(tmp_path, 1, model, opt)
    with pytest.raises(UserError, match="holds no data position"):
        run.resume(tmp_path, model, opt, loader=loader)
    assert run.resume(tmp_path, model, opt) == 1
    assert run.resume(tmp_path / "none", model, opt, loader=loader) == 0


class Stream(IterableDataset):
    """Yields 0..n-1 from where it stands; `state_dict` says how many it handed out."""

    def __init__(self, n: int, stateful: bool = True) -> None:
        self.n, self.at = n, 0
        if not stateful:
            self.state_dict = None  # type: ignore[assignment]

    def __iter__(self):
        while self.at < self.n:
            self.at += 1
            yield self.at - 1

    def state_dict(self):
        return {"at": self.at}

    def load_state_dict(self, state):
        self.at = state["at"]


def test_an_iterable_dataset_is_batched_and_resumed_from_its_own_state(run, tmp_path):
    model = run.setup(nn.Linear(2, 1))
    loader = run.loader(Stream(10), batch_size=3)
    it = iter(loader)
    assert [next(it).tolist() for _ in range(2)] == [[0, 1, 2], [3, 4, 5]]
    run.save(tmp_path, 2, model, loader=loader)
    again = run.loader(Stream(10), batch_size=3)
    assert run.resume(tmp_path, model, loader=again) == 2
    assert [b.tolist() for b in again] == [[6, 7, 8], [9]]


@pytest.mark.parametrize("options, found", [
    ({"shuffle": True}, "`shuffle` order or place a map-style dataset's samples; `Stream` is "
                        "an IterableDataset"),
    ({"position": 4, "seed": 0}, "`seed`, `position` order or place"),
])
def test_sampler_options_on_an_iterable_dataset_are_refused(run, options, found):
    with pytest.raises(UserError, match=found):
        run.loader(Stream(10), batch_size=2, **options)


def test_shuffle_false_on_an_iterable_dataset_is_what_it_does_anyway(run):
    assert [b.tolist() for b in run.loader(Stream(4), batch_size=2, shuffle=False)] == \
        [[0, 1], [2, 3]]


def test_a_none_from_collate_is_a_batch_not_the_end(run):
    assert list(run.loader(Stream(4), batch_size=2, collate_fn=lambda items: None)) == \
        [None, None]


@pytest.mark.parametrize("stateful, kwargs, found", [
    (False, {}, "`Stream` \\(an IterableDataset\\) has no state_dict\\(\\)"),
    (True, {"num_workers": 1}, "num_workers=1: the dataset's copies in the worker processes"),
])
def test_an_iterable_position_that_cannot_be_saved_is_refused(run, tmp_path, stateful, kwargs,
                                                               found):
    model = run.setup(nn.Linear(2, 1))
    loader = run.loader(Stream(10, stateful), batch_size=2, **kwargs)
    with pytest.raises(UserError, match=found):
        run.save(tmp_path, 1, model, loader=loader)


def test_a_dataset_without_a_length_that_is_not_iterable_is_refused(run):
    class Odd:
        def __getitem__(self, i):
            return i

    with pytest.raises(UserError, match="`Odd` has no __len__ and is no IterableDataset"):
        run.loader(Odd(), batch_size=2)


def _reference_fp16_step(model, opt, scaler, x, y, accum):
    """torch's documented AMP recipe, by hand."""
    for i in range(accum):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.mse_loss(model(x[i]), y[i])
        scaler.scale(loss / accum).backward()
    scaler.unscale_(opt)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
    return norm


def test_fp16_through_the_api_equals_torchs_amp_recipe(run):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4, 2, 4, 5, generator=g), torch.randn(4, 2, 4, 1, generator=g)

    def fresh():
        torch.manual_seed(1)
        return nn.Sequential(nn.Linear(5, 8), nn.GELU(), nn.Linear(8, 1))

    ref = fresh()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    ref_scaler = torch.amp.GradScaler("cpu")
    model, opt = run.setup(fresh(), lambda p: torch.optim.AdamW(p, lr=1e-2), precision="fp16")
    acc = run.accumulate(model, 2)
    for s in range(4):
        want = _reference_fp16_step(ref, ref_opt, ref_scaler, x[s], y[s], 2)
        for i in range(2):
            with acc.micro_step():
                acc.backward(nn.functional.mse_loss(model(x[s][i]), y[s][i]))
        assert torch.equal(run.clip_grad_norm_(model, 0.1), want)
        assert run.step(opt) == bool(torch.isfinite(want))  # an overflow is skipped
    for a, b in zip(ref.parameters(), model.parameters()):
        assert torch.equal(a, b)
    assert run.precision.scaler.get_scale() == ref_scaler.get_scale()
    assert any(not torch.equal(a, b) for a, b in zip(fresh().parameters(), ref.parameters()))


def test_the_fp16_loss_scale_is_checkpointed_and_restored(run, tmp_path):
    def fresh():
        return run.setup(nn.Linear(2, 1), lambda p: torch.optim.SGD(p, lr=0.1),
                         precision="fp16")

    model, opt = fresh()
    run.precision.scaler.scale(torch.ones(()))  # the scaler starts its scale lazily
    run.precision.scaler.update(1024.0)  # as after a few overflows
    run.save(tmp_path, 2, model, opt)
    model, opt = fresh()
    assert run.precision.scaler.get_scale() == 65536.0
    assert run.resume(tmp_path, model, opt) == 2
    assert run.precision.scaler.get_scale() == 1024.0


def _draws(run, acc, opt, steps: int, old_style: bool = False) -> list[list[float]]:
    """What each micro-step's dropout would draw (`torch.rand` inside `micro_step`), for
    `steps` optimizer steps. `old_style`: `run.seed_step(step)` before every micro-step, as
    the example did."""
    found: list[list[float]] = []
    for i in range(steps * acc.steps):
        if old_style:  # (from step 0)
            run.seed_step(i // acc.steps)
        with acc.micro_step():
            found.append(torch.rand(3).tolist())
        if acc.boundary:
            run.step(opt)
    return found


def test_each_micro_step_draws_its_own_masks_and_a_resume_replays_them(run, tmp_path):
    """Seeded in the accumulator's micro-step from (seed, optimizer step, micro-step,
    data-parallel rank), the step counted by `run.step` and restored by `run.resume`: the
    micro-batches of one step draw different dropout masks (the example's `seed_step` on
    every micro-step gave them the same), and a resumed loop draws what the whole one
    drew."""
    model, opt = run.setup(nn.Linear(2, 2), lambda p: torch.optim.SGD(p, lr=0.1))
    acc = run.accumulate(model, 2)
    whole = _draws(run, acc, opt, 4, old_style=True)
    assert whole[0] != whole[1] and whole[2] != whole[3], "micro-steps share their masks"
    assert len({tuple(d) for d in whole}) == len(whole)
    assert run.resume(tmp_path, model, opt) == 0 and run.optimizer_steps == 0
    assert _draws(run, acc, opt, 4) == whole  # `seed_step` changes nothing now
    assert run.optimizer_steps == 4
    run.save(tmp_path, 2, model, opt)
    assert run.resume(tmp_path, model, opt) == 2 and run.optimizer_steps == 2
    assert _draws(run, acc, opt, 2) == whole[4:]


def test_a_checkpoint_from_before_the_micro_step_seeding_resumes_saying_so(
        run, tmp_path, capsys, monkeypatch):
    from phalanx.runtime import save_resume as checkpoints

    model, opt = run.setup(nn.Linear(2, 2), lambda p: torch.optim.SGD(p, lr=0.1))
    run.save(tmp_path / "new", 3, model, opt)
    extras = checkpoints.CheckpointMethods._extras
    monkeypatch.setattr(checkpoints.CheckpointMethods, "_extras", lambda self, loader: {
        k: v for k, v in extras(self, loader).items() if k != checkpoints.SEEDING_KEY})
    run.save(tmp_path / "old", 3, model, opt)
    capsys.readouterr()
    assert run.resume(tmp_path / "new", model, opt) == 3
    assert "seeding" not in capsys.readouterr().out
    assert run.resume(tmp_path / "old", model, opt) == 3
    said = [line for line in capsys.readouterr().out.splitlines() if "seed" in line]
    assert len(said) == 1 and "step-00000003 predates" in said[0] and \
        "(seed, optimizer step, micro-step, data-parallel rank)" in said[0], said


def _scheduled(run):
    model = run.setup(nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    return model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)


def test_an_lr_scheduler_resumes_where_it_was_saved(run, tmp_path, capsys):
    model, opt, scheduler = _scheduled(run)
    for _ in range(3):
        opt.step()
        scheduler.step()
    run.save(tmp_path, 3, model, opt, stateful={"scheduler": scheduler})
    model, opt, fresh = _scheduled(run)
    assert run.resume(tmp_path, model, opt, stateful={"scheduler": fresh}) == 3
    assert fresh.state_dict() == scheduler.state_dict()  # (JSON gave lists back for lists)
    assert opt.param_groups[0]["lr"] == scheduler.get_last_lr()[0] == 0.5
    opt.step()
    fresh.step()  # and it goes on as the uninterrupted one would
    scheduler.step()
    assert fresh.get_last_lr() == scheduler.get_last_lr() == [0.25]
    assert "holds no state" not in capsys.readouterr().err


def test_a_checkpoint_without_the_schedulers_state_says_so(run, tmp_path, capsys):
    model, opt, scheduler = _scheduled(run)
    run.save(tmp_path, 1, model, opt)
    run.resume(tmp_path, model, opt, stateful={"scheduler": scheduler})
    assert "holds no state for `scheduler` (it was saved without them" in \
        capsys.readouterr().err


class _Tensorful:
    def state_dict(self):
        return {"buffer": object()}

    def load_state_dict(self, state):
        pass


@pytest.mark.parametrize("stateful, found", [
    ({"ema": object()}, "a object has no state_dict\\(\\) and load_state_dict\\(\\)"),
    ({"ema": _Tensorful()}, "`ema`'s state_dict\\(\\) is not JSON"),
    ([1], "takes \\{name: object\\}"),
])
def test_state_a_checkpoint_cannot_hold_as_json_is_refused_at_save(run, tmp_path, stateful,
                                                                   found):
    model, opt, _ = _scheduled(run)
    with pytest.raises(UserError, match=found):
        run.save(tmp_path, 1, model, opt, stateful=stateful)
    assert not list(tmp_path.glob("step-*"))
