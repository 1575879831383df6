"""run.check_consistency and run.diagnose_devices on 2 gloo ranks (shared launch)."""

from __future__ import annotations

import torch

from phalanx.strategies.guards import fingerprint


def test_identical_replicas_pass(results):
    for rank in (0, 1):
        found = torch.load(results / f"guards-rank{rank}.pt")
        assert found["fresh"] == "consistent"  # DDP broadcast rank 0's differing init
        assert found["after a step"] == "consistent"


def test_a_perturbed_replica_is_named_with_its_rank(results):
    for rank in (0, 1):  # every rank raises the same error: no rank is left waiting
        message = torch.load(results / f"guards-rank{rank}.pt")["perturbed"]
        assert message.startswith("[rank 1] the replicas' parameters and buffers have "
                                  "diverged: `head.weight` differs on rank(s) 1 from rank(s) "
                                  "0"), message


def test_tensors_off_the_device_are_named(results):
    found = torch.load(results / "guards-rank0.pt")["devices"]
    assert found == "input `batch[1]['mask']` is on meta, expected cpu"


def test_fingerprint_sees_one_flipped_bit():
    t = torch.randn(1000)
    flipped = t.clone()
    flipped.view(torch.int32)[517] ^= 1
    assert not torch.equal(fingerprint(t), fingerprint(flipped))
    assert torch.equal(fingerprint(t), fingerprint(t.clone()))
    swapped = t.clone()
    swapped[[3, 4]] = swapped[[4, 3]]  # same values, other places
    assert not torch.equal(fingerprint(t), fingerprint(swapped))
