"""`phalanx doctor --model`: what backward runs on, from whatever the model returns. A model
whose output holds no floating-point tensor (token ids, say) used to crash the check with
`AttributeError: 'int' object has no attribute 'backward'`; it is now a warning."""

from __future__ import annotations

import torch

from phalanx.doctor.model import _loss


def test_a_tensor_output_is_its_mean():
    assert float(_loss(torch.tensor([1.0, 3.0]))) == 2.0


def test_containers_sum_the_means_of_their_float_tensors():
    out = {"logits": torch.tensor([2.0, 4.0]), "ids": torch.tensor([7, 9]), "n": 3}
    assert float(_loss(out)) == 3.0
    assert float(_loss((torch.tensor([1.0]), torch.tensor([5.0, 7.0])))) == 7.0


def test_no_float_tensor_means_nothing_to_differentiate():
    assert _loss((torch.tensor([1, 2]), "text")) is None
    assert _loss({}) is None
