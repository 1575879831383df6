"""The Run API in a one-process world (in this test process, on an in-memory store)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn
from torch.utils.data import TensorDataset

import phalanx
from phalanx.config.sections import build_config
from phalanx.data.corpus import prepare
from phalanx.errors import UserError
from phalanx.train.loop import train


@pytest.fixture
def run():
    with phalanx.init(seed=3, threads=1) as r:
        yield r


def test_init_in_a_plain_process(run):
    assert (run.rank, run.world_size, run.backend, run.device.type) == (0, 1, "gloo", "cpu")
    assert run.strategy.name == "single" and run.is_main
    assert run.all_reduce_mean(2.5) == 2.5
    assert torch.equal(run.all_reduce_sum(torch.ones(3)), torch.ones(3))
    assert run.agree(True, "min") == 1.0 and run.agree(torch.tensor(4), "sum") == 4.0
    with pytest.raises(ValueError, match="max, min, sum"):
        run.agree(1, "mean")


def test_close_destroys_the_process_group():
    r = phalanx.init(seed=0, threads=1)
    assert torch.distributed.is_initialized()
    r.close()
    assert not torch.distributed.is_initialized()
    r.close()  # idempotent


def test_setup_refuses_an_optimizer_of_another_model(run):
    opt = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(UserError, match="not a parameter of the model"):
        run.setup(nn.Linear(2, 2), opt)


def test_setup_accepts_an_optimizer_built_before_the_move(run):
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    wrapped, same = run.setup(model, opt)
    assert same is opt and wrapped is model


def test_loader_epochs_reshuffle_and_batches_sit_on_the_device(run):
    loader = run.loader(TensorDataset(torch.arange(32)), batch_size=4)
    first = [b[0].tolist() for b in loader]
    second = [b[0].tolist() for b in loader]
    assert len(loader) == 8 and first != second
    assert sorted(sum(first, [])) == list(range(32))


def test_sync_batchnorm_on_cpu_says_so_plainly():
    with pytest.raises(UserError, match="`--sync-batchnorm` needs CUDA GPUs"):
        phalanx.init(seed=0, threads=1, strategy="ddp", sync_batchnorm=True)


def test_an_unknown_strategy_option_is_named():
    with pytest.raises(UserError, match="`bucket_cap_mb` is not an option of strategy `fsdp`"):
        phalanx.init(seed=0, threads=1, strategy="fsdp", bucket_cap_mb=10.0)


def test_single_strategy_refuses_many_ranks(run):
    from phalanx.strategies.single import SingleStrategy

    two = dataclasses.replace(run.topology, world_size=2)
    with pytest.raises(UserError, match="unrelated copies"):
        SingleStrategy(two).check()


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains(precision, corpus_file, cache_dir, run):
    cfg = build_config({"model": {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 32},
                        "train": {"precision": precision, "max_steps": 3, "micro_batch_size": 2,
                                  "eval_every": 3, "eval_batches": 1}})
    result = train(cfg, run, prepare(str(corpus_file), str(cache_dir), 0.1))
    assert len(result.losses) == 3 and all(l == l for l in result.losses)  # no NaN
    assert 3 in result.val_losses


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_device_is_pinned_from_local_rank():
    with phalanx.init(seed=0) as r:
        assert r.backend == "nccl" and r.device == torch.device("cuda", 0)
        assert torch.cuda.current_device() == 0


def test_fsdp_setup_refuses_what_cannot_be_sharded_and_materialises_meta_models():
    with phalanx.init(seed=0, threads=1, strategy="fsdp") as r:
        with pytest.raises(UserError, match="has no trainable ones"):
            r.setup(nn.ReLU())
        model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
        stale = torch.optim.SGD(model.parameters(), lr=0.1)  # built before sharding
        with pytest.raises(UserError, match="an optimizer built before setup updates nothing"):
            r.setup(model, stale)
        with torch.device("meta"):  # a model too big to build whole: init after sharding
            big = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        wrapped, opt = r.setup(big, lambda p: torch.optim.SGD(p, lr=0.1))
        weights = [p.full_tensor() for p in wrapped.parameters()]
        assert all(not w.is_meta and torch.isfinite(w).all() and w.abs().sum() > 0
                   for w in weights)


def test_eval_every_0_turns_evaluation_off(corpus_file, cache_dir, run):
    """One convention (issue 40.12): 0 turns a cadence off, as `--hang-timeout-s 0` and
    `--checkpoint-every 0` do; a negative value is refused naming the flag."""
    from phalanx.train.finish import final_losses

    cfg = build_config({"model": {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 32},
                        "train": {"max_steps": 2, "micro_batch_size": 2, "eval_every": 0}})
    result = train(cfg, run, prepare(str(corpus_file), str(cache_dir), 0.1))
    assert len(result.losses) == 2 and result.val_losses == {}
    assert final_losses(cfg, result, None, None) == "no validation loss (`--eval-every 0`)"
    with pytest.raises(UserError, match=r"`--eval-every` must be >= 0 \(0: off\), got -1"):
        build_config({"train": {"eval_every": -1}})


def test_log_of_a_loss_that_requires_grad_warns_nothing(run, tmp_path, recwarn):
    """`run.log(step, loss=loss)` at world size 1 (issue 40.7): no torch UserWarning from
    inside Phalanx for converting a tensor that requires grad."""
    run.log_dir = tmp_path
    loss = (torch.ones(2, requires_grad=True) * 3).sum()
    assert run.log(1, loss=loss) == {"step": 1, "loss": 6.0}
    run.end_log()
    assert not [w for w in recwarn if "requires_grad" in str(w.message)], \
        [str(w.message) for w in recwarn]


def test_the_loss_plot_names_the_runs_unit():
    """loss.png said nats/byte on every BPE run (issue 40.4): the unit is the run's."""
    import inspect

    from phalanx.report.plots import plot_losses
    from phalanx.train.finish import loss_unit

    assert loss_unit(build_config({"data": {"tokenizer": "bpe:512"}}), None) == "nats/token"
    assert loss_unit(build_config({}), None) == "nats/token"  # auto: BPE on the corpus
    assert loss_unit(build_config({"data": {"tokenizer": "bytes"}}), None) == "nats/byte"
    unit = inspect.signature(plot_losses).parameters["unit"]
    assert unit.default is inspect.Parameter.empty  # every caller says the unit
