"""MiniGPT in its GPT-2 configuration ↔ Hugging Face's `GPT2LMHeadModel`: the same
tensors under other names, in and out.

MiniGPT is GPT-2's architecture when it has biases, learned positions (`--no-rope`), GELU,
the head tied to the token embedding, and neither QK-norm nor a logit soft-cap
(`--preset gpt2-124m` sets all of them). Then each tensor has a twin in a GPT-2 checkpoint:
`blocks.N.…` is `transformer.h.N.…`, `wte`/`wpe`/`ln_f` sit under `transformer.`, and the
four projections (`attn.c_attn`, `attn.c_proj`, `mlp.c_fc`, `mlp.c_proj`) are stored
transposed, since GPT-2's `Conv1D` keeps its weight as (in, out) where `nn.Linear` keeps
(out, in). The tied head is absent from the files, as `save_pretrained` drops it. Weights
round-trip bit for bit.

The logits agree with the nonlinearity: MiniGPT's GELU is the exact one. An export says so
in its config.json (`activation_function: "gelu"`), and transformers then computes what
MiniGPT does (equal within float rounding); OpenAI's GPT-2 checkpoints use the tanh
approximation (`gelu_new`), so a MiniGPT started from them is close to GPT-2, not equal
(said in one line when it loads). And the token ids must mean the same tokens: GPT-2's
weights expect GPT-2's tokenizer, while Phalanx's `bpe:50257` is trained on your corpus.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import torch
import torch.nn as nn

from phalanx.config.sections import refuse_unless_gpt2
from phalanx.errors import UserError

CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
HEAD = "lm_head.weight"


def hf_name(name: str) -> str:
    """The GPT-2 checkpoint's name for MiniGPT's tensor `name` (not the tied head)."""
    return "transformer." + (name.replace("blocks.", "h.", 1) if name.startswith("blocks.")
                             else name)


def transposed(name: str) -> bool:
    return name.endswith(CONV1D)


def gpt2_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """MiniGPT's state dict as a GPT-2 checkpoint's: renamed, the projections transposed
    (contiguous copies), the tied head left out."""
    return {hf_name(k): (v.t() if transposed(k) else v).detach().cpu().contiguous()
            for k, v in state.items() if k != HEAD}


def gpt2_config(config: Any) -> dict[str, Any]:
    """config.json for transformers' GPT2LMHeadModel with MiniGPT's shape."""
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
            "vocab_size": config.vocab_size, "n_positions": config.block_size,
            "n_embd": config.n_embd, "n_layer": config.n_layer, "n_head": config.n_head,
            "n_inner": None, "activation_function": "gelu", "layer_norm_epsilon": 1e-5,
            "resid_pdrop": config.dropout, "embd_pdrop": config.dropout,
            "attn_pdrop": config.dropout, "tie_word_embeddings": True,
            "bos_token_id": None, "eos_token_id": None}  # Phalanx's tokenizers have none


def export_gpt2(model: nn.Module, folder: Path) -> Path:
    """`folder/model.safetensors` and `folder/config.json` as transformers'
    `GPT2LMHeadModel.save_pretrained` writes them (MiniGPT in GPT-2's shape); the path."""
    from phalanx.checkpoint.export import write_weights

    config: Any = model.config
    refuse_unless_gpt2(config, "`phalanx export --format gpt2`")
    return write_weights(folder, "model.safetensors", gpt2_state(model.state_dict()),
                         gpt2_config(config))


def load_gpt2(model: nn.Module, path: str | Path, config: Any) -> str | None:
    """Fill the set-up MiniGPT `model` from the GPT-2 `save_pretrained` directory `path`,
    each rank reading only the slices it holds (DCP's Hugging Face reader, into views of
    its own tensors: transposed where GPT-2 stores them so). A collective. Names with or
    without `transformer.` (GPT2LMHeadModel's, or GPT2Model's as OpenAI's `gpt2` files
    on the hub have them). Returns a note when the checkpoint's GELU is not MiniGPT's."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from phalanx.checkpoint.pretrained import hf_reader, mismatched

    refuse_unless_gpt2(config, f"`--init-from {path}` without `--model`")
    reader, stored = hf_reader(path)
    act = _their_head_and_gelu(path, stored)
    bare = "transformer.wte.weight" not in stored and "wte.weight" in stored
    # (typed as any state-dict value by torch; a module's state dict holds tensors).
    # FSDP2's and DDP's state dicts hold the model's own tensors (sharded: its DTensor
    # parameters), so loading into views of them fills the model in place
    state = cast(dict[str, torch.Tensor], get_model_state_dict(model))
    views = {hf_name(k).removeprefix("transformer." if bare else ""):
             (v.t() if transposed(k) else v) for k, v in state.items() if k != HEAD}
    bad = mismatched(views, stored)
    if bad:
        name, size = bad
        found = f"is {size}" if size is not None else "is missing"
        raise UserError(f"`{path}`'s `{name}` {found}; this MiniGPT's is "
                        f"{tuple(views[name].shape)}: set --n-layer, --n-head, --n-embd and "
                        f"--block-size (n_positions) as its config.json says, and a "
                        f"tokenizer of its vocabulary size.")
    dcp.load(views, storage_reader=reader)
    if act in (None, "gelu"):
        return None
    return (f"`{path}` was trained with activation_function `{act}` (GELU's tanh "
            f"approximation); MiniGPT's GELU is the exact one, so its outputs are close to "
            f"that model's, not equal.")


GELUS = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh")  # exact, or tanh-approximated


def _their_head_and_gelu(path: str | Path, stored: dict) -> str | None:
    """The checkpoint's activation (None: not said); a UserError when its head is not tied
    to the embedding, or its nonlinearity is no GELU (MiniGPT cannot hold either)."""
    import json

    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    untied = config.get("tie_word_embeddings") is False or HEAD in stored
    act = config.get("activation_function")
    if untied:
        raise UserError(f"`{path}` has an output head of its own (not tied to the token "
                        f"embedding); MiniGPT in GPT-2's shape ties them, so that head "
                        f"would be dropped. Start from a tied GPT-2 checkpoint.")
    if act is not None and act not in GELUS:
        raise UserError(f"`{path}` was trained with activation_function `{act}`; MiniGPT "
                        f"in GPT-2's shape computes GELU. Start from a GPT-2 checkpoint "
                        f"with GELU.")
    return act
