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


def gpt2_config(config: Any, vocab_size: int) -> dict[str, Any]:
    """config.json for transformers' GPT2LMHeadModel with MiniGPT's shape."""
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
            "vocab_size": vocab_size, "n_positions": config.block_size,
            "n_embd": config.n_embd, "n_layer": config.n_layer, "n_head": config.n_head,
            "n_inner": None, "activation_function": "gelu", "layer_norm_epsilon": 1e-5,
            "resid_pdrop": config.dropout, "embd_pdrop": config.dropout,
            "attn_pdrop": config.dropout, "tie_word_embeddings": True,
            "bos_token_id": None, "eos_token_id": None}  # Phalanx's tokenizers have none


def export_gpt2(model: nn.Module, folder: Path) -> Path:
    """`folder/model.safetensors` and `folder/config.json` as transformers'
    `GPT2LMHeadModel.save_pretrained` writes them (MiniGPT in GPT-2's shape); the path."""
    import json

    from safetensors.torch import save_file

    from phalanx.paths import atomic_write, replacing

    config: Any = model.config
    refuse_unless_gpt2(config, "`phalanx export --format gpt2`")
    path = folder / "model.safetensors"
    with replacing(path) as tmp:  # a link at either name is replaced, never written through
        save_file(gpt2_state(model.state_dict()), str(tmp), metadata={"format": "pt"})
    atomic_write(folder / "config.json",
                 json.dumps(gpt2_config(config, config.vocab_size), indent=2))
    return path


def load_gpt2(model: nn.Module, path: str | Path, config: Any) -> str | None:
    """Fill the set-up MiniGPT `model` from the GPT-2 `save_pretrained` directory `path`,
    each rank reading only the slices it holds (DCP's Hugging Face reader, into views of
    its own tensors: transposed where GPT-2 stores them so). A collective. Returns a note
    when the checkpoint's GELU is not MiniGPT's."""
    import json

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    refuse_unless_gpt2(config, f"`--init-from {path}` without `--model`")
    where = Path(path)
    if not where.is_dir() or not any(where.glob("*.safetensors")):
        raise UserError(f"`{path}` is not a Hugging Face model directory: no *.safetensors "
                        f"file in it (write one with save_pretrained(DIR)).")
    reader = dcp.HuggingFaceStorageReader(str(where))
    stored = reader.read_metadata().state_dict_metadata
    # (typed as any state-dict value by torch; a module's state dict holds tensors)
    state = cast(dict[str, torch.Tensor], get_model_state_dict(model))
    views = {hf_name(k): (v.t() if transposed(k) else v) for k, v in state.items()
             if k != HEAD}
    for name, view in views.items():
        size = tuple(getattr(stored.get(name), "size", ()) or ())
        if name not in stored or size != tuple(view.shape):
            found = f"is {size}" if name in stored else "is missing"
            raise UserError(f"`{path}`'s `{name}` {found}; this MiniGPT's is "
                            f"{tuple(view.shape)}: set --n-layer, --n-head, --n-embd and "
                            f"--block-size (n_positions) as its config.json says, and a "
                            f"tokenizer of its vocabulary size.")
    dcp.load(views, storage_reader=reader)  # in place: the views are the model's tensors
    try:
        act = json.loads((where / "config.json").read_text()).get("activation_function")
    except (OSError, ValueError):
        act = None
    if act not in (None, "gelu"):
        return (f"`{path}` was trained with activation_function `{act}`; MiniGPT's GELU "
                f"is the exact one, so its outputs are close to that model's, not equal.")
    return None
