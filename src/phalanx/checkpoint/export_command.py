"""`phalanx export RUN_DIR_OR_CHECKPOINT --out model.safetensors`: consolidated weights
from a (sharded, any world size) DCP checkpoint, plus `config.json` beside them."""

from __future__ import annotations

import argparse
from pathlib import Path

from phalanx.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="RUN_DIR_OR_CHECKPOINT",
                        help="a run directory (its newest valid checkpoint is used) or one "
                             "checkpoint directory (…/checkpoints/step-…)")
    parser.add_argument("--out", required=True, metavar="FILE",
                        help="the .safetensors file to write; config.json goes beside it")


def _target(out: str) -> Path:
    path = Path(out).expanduser()
    if path.is_dir():
        path = path / "model.safetensors"
    if path.suffix != ".safetensors":
        raise UserError(f"`--out` `{out}` should name a .safetensors file (or a directory).")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create `{path.parent}` for `--out`: {exc.strerror}.") from None
    return path


def run_export(ns: argparse.Namespace, argv: list[str]) -> int:
    from phalanx.checkpoint.export import export_weights
    from phalanx.checkpoint.resume import find_checkpoint
    from phalanx.checkpoint.store import load_checkpoint, read_sidecar
    from phalanx.config import from_dict
    from phalanx.train.loop import build_model

    target = _target(ns.out)
    checkpoint = find_checkpoint(ns.source, lambda message: print(message, flush=True))
    meta = read_sidecar(checkpoint)["meta"]
    cfg = from_dict(meta.get("config", {}))
    model = build_model(cfg)
    load_checkpoint(checkpoint, model, None)
    try:
        path = export_weights(model, target.parent, {"phalanx": cfg.to_dict()}, target.name)
    except OSError as exc:
        raise UserError(f"cannot write `{target}`: {exc.strerror}.") from None
    params = sum(p.numel() for p in model.parameters())
    step = meta.get("train_state", {}).get("step", "?")
    print(f"exported step {step} of `{checkpoint}` → {path} ({params:,} parameters, "
          f"{path.stat().st_size / 1e6:.1f} MB) and {path.parent / 'config.json'}")
    return 0
