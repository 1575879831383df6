"""strategies/fsdp_output.py in one process: which forward outputs hide their tensors from
torch's pytree (and so from FSDP2's backward hooks)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

from phalanx.strategies.fsdp_output import hidden_tensor


@dataclass
class Out:
    loss: torch.Tensor


def test_an_output_pytree_cannot_open_is_named_with_the_tensor_it_hides():
    loss = torch.ones(2, requires_grad=True).sum()
    assert hidden_tensor(SimpleNamespace(loss=loss)) == ("SimpleNamespace", "loss")
    assert hidden_tensor(Out(loss)) == ("Out", "loss")  # a plain dataclass: not a pytree node
    assert hidden_tensor([1, SimpleNamespace(loss=loss)]) == ("SimpleNamespace", "loss")


def test_outputs_pytree_opens_or_without_gradients_are_fine():
    loss = torch.ones(2, requires_grad=True).sum()
    for fine in (loss, (loss, None), {"loss": loss}, [loss], SimpleNamespace(loss=loss.detach()),
                 (loss, SimpleNamespace(aux=loss))):  # (pytree found one: FSDP2 hooks it)
        assert hidden_tensor(fine) is None, fine
