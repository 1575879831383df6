"""`phalanx plan --model pkg.module:factory`: the facts of a user's model, built on the
meta device (nothing allocated) — as `phalanx doctor --model` takes it: a function that
returns the module, or (module, example input).

Parameters and FSDP's blocks come from the module itself (the same block detection as
the fsdp strategy). Activations are traced: one forward of the example on the meta device
under autograd's saved-tensor hooks adds up every tensor kept for backward (each storage
once, parameters excluded), plus the output. Less is known than for MiniGPT: the peak is
taken at the start of backward (saved tensors, the output and one output-sized
gradient) or at the optimizer step; this is not checked against measurement here.
"""

from __future__ import annotations

from phalanx.errors import UserError
from phalanx.plan import formulas as f
from phalanx.plan.estimate import ModelFacts


def user_facts(spec: str) -> ModelFacts:
    import torch

    from phalanx.models.user import make_model
    from phalanx.strategies.blocks import find_blocks

    with torch.device("meta"):
        model, example = make_model(spec)
    if example is None:
        raise UserError(f"`--model {spec}` returned no example input: `phalanx plan` traces "
                        f"one forward to count activations. Return (model, example) from "
                        f"the factory, with the example at the micro-batch size you plan.")
    shapes, seen = [], set()
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            shapes.append(tuple(p.shape))
    blocks = find_blocks(model)
    block_shapes = [tuple(p.shape) for p in blocks[0].parameters()] if blocks else []
    in_blocks = {id(p) for b in blocks for p in b.parameters()}
    root = [tuple(p.shape) for p in dict.fromkeys(model.parameters()) if id(p) not in in_blocks]
    saved, output = trace(model, example, spec)
    n = sum(map(f.numel, shapes))
    return ModelFacts(shapes, block_shapes, root, len(blocks), block_saved=0, block_input=0,
                      head_saved=saved, logits=output, loss_grads=output,
                      block_grads_in_flight=0, flops_per_token=6 * n, tokens=0)


def trace(model, example, spec: str) -> tuple[int, int]:
    """(bytes saved for backward, bytes of the output) of one forward on the meta device."""
    import torch

    params = {p.untyped_storage()._cdata for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage._cdata not in params:
            kept[storage._cdata] = storage.nbytes()
        return t

    inputs = example if isinstance(example, (tuple, list)) else (example,)
    inputs = tuple(x.to("meta") if isinstance(x, torch.Tensor) else x for x in inputs)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(*inputs)
    except Exception as exc:  # the user's forward: say what it raised, in one line
        raise UserError(f"`--model {spec}`: its forward on the meta device raised "
                        f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                        f". `phalanx plan` needs a forward that runs without real data "
                        f"(no .item(), no data-dependent shapes).") from None
    outs = out if isinstance(out, (tuple, list)) else (out,)
    output = sum(o.untyped_storage().nbytes() for o in outs if isinstance(o, torch.Tensor))
    return sum(kept.values()), output
