"""Consolidated weights as safetensors + a plain `config.json`, loadable without Phalanx.

The output head is tied to the token embedding, so only `wte.weight` is stored and
`config.json` says `"tie_word_embeddings": true`; `load_minigpt` re-ties on load.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from phalanx.models import GPTConfig, MiniGPT
from phalanx.paths import atomic_write, replacing

TIED = "lm_head.weight"


def export_weights(model: MiniGPT, out_dir: Path, extra: dict[str, Any] | None = None,
                   filename: str = "model.safetensors") -> Path:
    """Write `out_dir/filename` and `out_dir/config.json`; returns the weights' path."""
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if k != TIED}
    path = Path(out_dir) / filename
    # written beside and renamed into place: a link at either name is replaced, never
    # written through; safetensors creates its file 0600, `replacing` gives it the umask's
    with replacing(path) as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})
    config = {"model_type": "minigpt", **dataclasses.asdict(model.config),
              "tie_word_embeddings": True, "tokenizer": "bytes", **(extra or {})}
    atomic_write(Path(out_dir) / "config.json", json.dumps(config, indent=2))
    return path


def load_minigpt(out_dir: Path, device: str | torch.device = "cpu",
                 filename: str = "model.safetensors") -> MiniGPT:
    config = json.loads((Path(out_dir) / "config.json").read_text())
    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    model = MiniGPT(GPTConfig(**{k: v for k, v in config.items() if k in fields}))
    missing, unexpected = model.load_state_dict(
        load_file(str(Path(out_dir) / filename), device=str(device)), strict=False)
    if set(missing) - {TIED} or unexpected:
        raise ValueError(f"weights do not match config.json: missing {missing}, "
                         f"unexpected {unexpected}")
    return model.to(device)
