"""The optimizer step's own temporaries (plan.formulas.step_temporaries): Phalanx's
MuonAdamW steps parameter by parameter, and at its step it holds more than its state —
against figures taken with torch's memory tracker (DDP, and FSDP on 2 gloo ranks, measured
when this was written: the numbers below) and, here, measured again on one process."""

from __future__ import annotations

import torch

from phalanx.plan import estimate
from phalanx.plan import formulas as f

MIB = 2**20


def _tracked_peak(model, opt, x, y) -> dict:
    """Two steps to make the state, then one step under torch's memory tracker: its peak
    snapshot on the CPU, by category. The logits stay alive through backward and the
    step, as in a training loop (the Muon test's OPT reading is the same either way)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    def step() -> None:
        logits, loss = model(x, y)  # (the logits alive through backward, as in a loop)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)

    for _ in range(2):
        step()
    tracker = MemTracker()
    tracker.track_external(model, opt)
    with tracker:
        step()
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]


def test_each_optimizers_temporaries_against_the_tracker_figures():
    # Muon on one 1024×256 matrix: the update, the normalised matrix, the 256×256 Gram
    # matrix and its product, the next iterate (3.5 MiB measured)
    assert f.step_temporaries([(1024, 256)], [True], [[0]]) == 3.5 * MIB
    # AdamW's single-tensor loop over two 4096×256 matrices: the square root and its
    # division for the second, the first's denominator still referenced (12 MiB measured)
    assert f.step_temporaries([(4096, 256)] * 2, [False] * 2, [[0, 1]]) == 12 * MIB
    # FSDP over 2 ranks: the update's shard and its gathered whole (4.0 MiB measured), and
    # the previous matrix's orthogonalised update beside it (4.25 MiB measured)
    assert f.step_temporaries([(1024, 256)], [True], [[0]], W=2) == 4.0 * MIB
    assert f.step_temporaries([(256, 256), (1024, 256)], [True] * 2, [[0, 1]], W=2) \
        == 4.25 * MIB
    # groups are separate calls: nothing carried from one to the next
    assert f.step_temporaries([(4096, 256)] * 2, [False] * 2, [[0], [1]]) == 8 * MIB


def test_a_fused_adamw_step_adds_nothing_and_muon_adds_its_temporaries():
    args = dict(L=2, H=2, C=64, T=8, V=512, B=1, bias=False, rope=True, tied=False)
    fused = estimate.minigpt_facts(**args, optimizer="adamw")
    ddp = estimate.VARIANTS[0]
    assert estimate.step_optimizer_bytes(fused, ddp, 2) == estimate.optimizer_bytes(fused, ddp, 2)
    muon = estimate.minigpt_facts(**args, optimizer="muon")
    for variant in estimate.VARIANTS:
        assert estimate.step_optimizer_bytes(muon, variant, 2) > \
            estimate.optimizer_bytes(muon, variant, 2), variant.label


def test_muons_step_peak_is_what_the_tracker_measures_on_one_process():
    from phalanx.models.minigpt import GPTConfig, MiniGPT
    from phalanx.runtime.muon import muon_adamw

    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=512, block_size=8, n_layer=2, n_head=2, n_embd=64, rope=True,
                    activation="relu2", tie_embeddings=False)
    model = MiniGPT(cfg)
    opt = muon_adamw(model, model.parameters(), lr=1e-3, muon_lr=0.02, weight_decay=0.1,
                     betas=(0.9, 0.95), vocab_size=512)
    x, y = torch.randint(0, 512, (1, 8)), torch.randint(0, 512, (1, 8))
    snap = _tracked_peak(model, opt, x, y)
    measured = next(v for k, v in snap.items() if str(k).endswith("OPT"))
    facts = estimate.minigpt_facts(L=2, H=2, C=64, T=8, V=512, B=1, bias=False, rope=True,
                                   tied=False, optimizer="muon")
    predicted = estimate.step_optimizer_bytes(facts, estimate.VARIANTS[0], 1)
    state = estimate.optimizer_bytes(facts, estimate.VARIANTS[0], 1)
    assert measured > state * 1.2  # the temporaries are there to be counted
    assert abs(predicted - measured) <= 0.001 * measured, (predicted, measured, state)


def test_the_heads_backward_is_the_peak_of_a_wide_model_on_a_short_batch():
    """n_embd 256, vocabulary 4096, 16 tokens: the head's V×C weight gradient (4 MiB), made
    before it lands in `.grad`, outweighs every activation; the plan's peak is that moment
    and equals the tracker's (one process, fused AdamW: no step temporaries)."""
    from phalanx.models.minigpt import GPTConfig, MiniGPT
    from phalanx.runtime.optim import adamw

    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=4096, block_size=16, n_layer=2, n_head=2, n_embd=256,
                    rope=True, activation="relu2", tie_embeddings=False)
    model = MiniGPT(cfg)
    opt = adamw(model.parameters(), lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95),
                device=torch.device("cpu"))
    x, y = torch.randint(0, 4096, (1, 16)), torch.randint(0, 4096, (1, 16))
    measured = _tracked_peak(model, opt, x, y)["Total"]
    facts = estimate.minigpt_facts(L=2, H=2, C=256, T=16, V=4096, B=1, bias=False, rope=True,
                                   tied=False, optimizer="adamw")
    planned = estimate.peak(facts, estimate.VARIANTS[0], 1, False)
    assert planned["moment"] == "head backward", planned
    assert abs(planned["peak"] - measured) <= 0.002 * measured, (planned, measured)


def test_ddp_without_bucket_views_holds_autograds_gradients_beside_its_buckets():
    """--no-gradient-as-bucket-view: no second copy at backward start, the blocks done at a
    block's backward, every gradient at the optimizer step (measured on 2 gloo ranks: the
    wide shape 76.3 predicted / 76.0 MiB measured, the e2e shape 27.7 / 27.7)."""
    from dataclasses import replace

    facts = estimate.minigpt_facts(L=2, H=2, C=64, T=8, V=512, B=1, bias=False)
    copy = replace(facts, bucket_copy=True)
    P = f.param_bytes(facts.param_shapes)
    block = f.param_bytes(facts.block_shapes)
    for variant in estimate.VARIANTS:
        plain, twice = (estimate.moments(x, variant, 2, False) for x in (facts, copy))
        extra = {m: twice[m]["communication"] - plain[m]["communication"] for m in plain}
        if variant.sharded:
            assert set(extra.values()) == {0}, variant.label
            continue
        assert extra["backward start"] == 0 and extra["optimizer step"] == P
        assert extra["block 1 backward"] == 0 and extra["block 0 backward"] == block
    # a model whose blocks were not found (a user's, traced): no block moments, and every
    # gradient still beside the buckets at the step
    blockless = replace(facts, block_shapes=[], n_blocks=0)
    plain, twice = (estimate.moments(replace(blockless, bucket_copy=c), estimate.VARIANTS[0],
                                     2, False)["optimizer step"] for c in (False, True))
    assert twice["communication"] - plain["communication"] == P
