"""`phalanx export RUN_DIR_OR_CHECKPOINT --out model.safetensors`: consolidated weights
from a (sharded, any world size) DCP checkpoint, plus `config.json` beside them (a
`--model` factory's run: the factory rebuilds the module, so its module must be
importable here; config.json records it). Export runs no code a checkpoint names: a
factory's run is exported only when `--model` names the same factory here. A
checkpoint a script wrote (`run.save`) of a transformers model: `--out DIR`, the
directory `from_pretrained` reads."""

from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path

from phalanx.config.sections import from_dict
from phalanx.errors import UserError
from phalanx.paths import kind, refuse_link


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="RUN_DIR_OR_CHECKPOINT",
                        help="a run directory (its newest valid checkpoint is used) or one "
                             "checkpoint directory (…/checkpoints/step-…)")
    parser.add_argument("--out", required=True, metavar="FILE",
                        help="the .safetensors file to write; config.json goes beside it "
                             "(a script's transformers model: the directory to write)")
    parser.add_argument("--model", metavar="PKG.MODULE:FACTORY", default=None,
                        help="a `--model` factory's run: the factory it was trained with, "
                             "named again here (export never imports the code a checkpoint "
                             "names on its own; default: none, a MiniGPT run)")
    parser.add_argument("--format", choices=("phalanx", "gpt2"), default="phalanx",
                        help="gpt2: a MiniGPT run in GPT-2's shape (`--preset gpt2-124m`) "
                             "written as transformers' GPT2LMHeadModel.save_pretrained "
                             "writes it, into the directory `--out` (from_pretrained reads "
                             "it; default: Phalanx's own names)")
    parser.add_argument("--force", action="store_true",
                        help="overwrite an existing FILE or config.json beside it "
                             "(default: refuse)")


def _target(out: str, force: bool) -> Path:
    path = Path(out).expanduser()
    if kind(path) == "a directory":
        path = path / "model.safetensors"
    if path.suffix != ".safetensors" or not path.stem:
        raise UserError(f"`--out` `{out}` should name a .safetensors file (or a directory).")
    _missing_parents(path.parent)  # created only when the export is written
    for existing in (path, path.parent / "config.json"):
        refuse_link(existing, "where `phalanx export` writes",
                    "Remove the link or choose another `--out` (`--force` replaces files; it "
                    "never writes through a link).")
        found = kind(existing)
        if found not in ("missing", "a regular file"):
            raise UserError(f"`{existing}` is {found}; `phalanx export` writes a regular file "
                            f"there. Choose another `--out`.")
        if found != "missing" and not force:
            raise UserError(f"`{existing}` already exists; `phalanx export` does not overwrite "
                            f"it silently. Pass `--force`, or choose another `--out`.")
    return path


def _missing_parents(parent: Path) -> list[Path]:
    """The directories of `--out` that do not exist yet, outermost first; a UserError when
    the nearest one that exists is not a directory."""
    missing, here = [], parent
    while not os.path.lexists(here) and here.parent != here:
        missing.append(here)
        here = here.parent
    if not here.is_dir():
        found = kind(here) if kind(here) != "missing" else "a link to nothing"
        raise UserError(f"cannot create `{parent}` for `--out`: `{here}` is {found}, not a "
                        f"directory. Choose another `--out`.")
    if missing and not os.access(here, os.W_OK | os.X_OK):
        raise UserError(f"cannot create `{parent}` for `--out`: `{here}` is not writable "
                        f"here. Choose another `--out`.")
    return missing[::-1]


@contextlib.contextmanager
def _parents_while_writing(parent: Path):
    """Create the missing directories of `--out`; when the write fails, remove the ones
    made here (a failed export leaves no empty directories behind)."""
    made: list[Path] = []
    try:
        for directory in _missing_parents(parent):
            try:
                directory.mkdir()
            except FileExistsError:  # made meanwhile by someone else: theirs
                continue
            except OSError as exc:
                raise UserError(f"cannot create `{directory}` for `--out`: "
                                f"{exc.strerror or exc}.") from None
            made.append(directory)
        yield
    except BaseException:
        for directory in reversed(made):
            with contextlib.suppress(OSError):  # only if still empty
                directory.rmdir()
        raise


def _saved_meta(checkpoint: Path) -> dict:
    """The checkpoint's meta from its sidecar, or a UserError saying why not."""
    from phalanx.checkpoint.store import read_sidecar

    try:
        meta = read_sidecar(checkpoint)["meta"]
        if not isinstance(meta, dict):
            raise TypeError
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"checkpoint `{checkpoint}` has no readable training state "
                        f"(`train_state.json`); export a checkpoint written by `phalanx "
                        f"train` or by a script's `run.save`.") from None
    return meta


def _saved_config(checkpoint: Path, meta: dict):
    """The trainer's step and config from the checkpoint's meta."""
    if "config" not in meta:
        raise UserError(
            f"checkpoint `{checkpoint}` was written by a script (run.save) whose model "
            f"Phalanx cannot rebuild (only MiniGPT and transformers models are). Export it "
            f"from the script: run.export(model, DIR).")
    step = meta.get("train_state", {}).get("step", "?")
    return step, from_dict(meta["config"], f"checkpoint `{checkpoint}`'s configuration")


def _same_factory(checkpoint: Path, saved: str | None, given: str | None) -> None:
    """The factory the checkpoint names is imported and called only when the user names
    the same one (`--model`): a checkpoint is data, and loading data runs no code."""
    if saved == given:
        return
    if saved is None:
        raise UserError(f"checkpoint `{checkpoint}` holds a MiniGPT model, not a `--model` "
                        f"factory's; export it without `--model {given}`.")
    fix = (f"if you trust that code, name it yourself: `--model {saved}`" if given is None
           else f"`--model {given}` is another; export with the factory it was trained "
                f"with, or not at all")
    raise UserError(f"checkpoint `{checkpoint}` names `--model {saved}`, code that export "
                    f"would import and run; Phalanx runs no code a checkpoint names on its "
                    f"own. {fix[0].upper()}{fix[1:]}.")


def _export_library_model(checkpoint: Path, recipe: dict, out: str, force: bool) -> int:
    """A script's transformers model: rebuilt from the checkpoint's recipe, its weights
    loaded, written as its library's directory (`from_pretrained` reads it)."""
    from phalanx.checkpoint.export import build_from_recipe, export_pretrained
    from phalanx.checkpoint.rundir import step_of
    from phalanx.checkpoint.store import load_checkpoint

    target = Path(out).expanduser()
    if kind(target) != "missing" and not force:
        raise UserError(f"`{target}` already exists; `phalanx export` does not overwrite it "
                        f"silently. Pass `--force`, or choose another `--out`.")
    model = build_from_recipe(recipe, f"checkpoint `{checkpoint}`")
    load_checkpoint(checkpoint, model, None)
    path = export_pretrained(model, model.state_dict(), target)
    params = sum(p.numel() for p in model.parameters())
    print(f"exported step {step_of(checkpoint)} of `{checkpoint}` → {path}/ "
          f"({recipe['class']}, {params:,} parameters; from_pretrained reads it)")
    return 0


def run_export(ns: argparse.Namespace, argv: list[str]) -> int:
    from safetensors import SafetensorError

    from phalanx.checkpoint.export import MODEL_KEY, export_weights
    from phalanx.checkpoint.gpt2 import export_gpt2
    from phalanx.checkpoint.resume import find_checkpoint
    from phalanx.checkpoint.store import load_checkpoint
    from phalanx.models import build_model

    _missing_parents(Path(ns.out).expanduser().parent)  # refused before anything is read
    checkpoint = find_checkpoint(ns.source, lambda message: print(message, flush=True))
    meta = _saved_meta(checkpoint)
    if MODEL_KEY in meta:  # a script's transformers model: a directory from_pretrained reads
        if ns.format == "gpt2":
            raise UserError(f"`--format gpt2` writes MiniGPT as GPT-2; checkpoint "
                            f"`{checkpoint}` holds a transformers model, which is exported "
                            f"as its own from_pretrained directory: leave out `--format`.")
        return _export_library_model(checkpoint, meta[MODEL_KEY], ns.out, ns.force)
    step, cfg = _saved_config(checkpoint, meta)
    target = _target(_gpt2_out(ns.out, cfg) if ns.format == "gpt2" else ns.out, ns.force)
    _same_factory(checkpoint, cfg.model.factory, ns.model)
    vocab = meta.get("vocab_size")  # (checkpoints before it was recorded: bytes, 256)
    model = build_model(cfg, vocab if isinstance(vocab, int) and vocab > 0 else 256)
    load_checkpoint(checkpoint, model, None)
    tokenizer_json = _run_tokenizer(checkpoint, meta.get("tokenizer"))
    try:
        with _parents_while_writing(target.parent):
            path = export_gpt2(model, target.parent) if ns.format == "gpt2" else \
                export_weights(model, target.parent, {
                    "tokenizer": (meta.get("tokenizer") or {}).get("label")
                    or cfg.data.tokenizer,  # (unresolved: `auto` would walk a path it names)
                    "phalanx": cfg.to_dict()}, target.name)
            tokenizer = _copy_tokenizer(checkpoint, tokenizer_json, target.parent)
    except (OSError, SafetensorError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
        raise UserError(f"cannot write `{target}`: {reason}.") from None
    params = sum(p.numel() for p in model.parameters())
    made = f"`--model {cfg.model.factory}`, " if cfg.model.factory else ""
    print(f"exported step {step} of `{checkpoint}` → {path} ({made}{params:,} parameters, "
          f"{path.stat().st_size / 1e6:.1f} MB) and {path.parent / 'config.json'}"
          + (f" and {tokenizer}" if tokenizer is not None else ""))
    return 0


def _gpt2_out(out: str, cfg) -> str:
    """`--format gpt2`: the directory's model.safetensors (the name from_pretrained reads);
    a model that is not GPT-2's shape refused before anything is written."""
    from phalanx.config.sections import refuse_unless_gpt2

    if cfg.model.factory is not None:
        raise UserError(f"`--format gpt2` writes MiniGPT as GPT-2; this run trained `--model "
                        f"{cfg.model.factory}`. Export it without `--format gpt2`.")
    refuse_unless_gpt2(cfg.model, "`phalanx export --format gpt2`")
    if out.endswith(".safetensors"):
        raise UserError(f"`--format gpt2` writes a directory (model.safetensors, config.json "
                        f"and the run's tokenizer.json in it); `--out {out}` names a file. "
                        f"Give the directory.")
    return str(Path(out) / "model.safetensors")


def _run_tokenizer(checkpoint: Path, record: dict | None) -> bytes | None:
    """The run's `tokenizer.json` (written in its run directory when it started: a BPE
    or the user's file), read as the run's own: not through a link, a regular file, the
    tokenizer the checkpoint records (its digest), one Phalanx loads. None for a run on
    bytes (or a run directory without one); a UserError otherwise."""
    from phalanx.data.cache import bytes_digest
    from phalanx.data.tokenizer import HFTokenizer
    from phalanx.paths import read_regular

    found = _run_dir_of(checkpoint) / "tokenizer.json"
    hint = (f"Remove it from `{found.parent}` to export the weights alone, or export the "
            f"run from the directory it trained in.")
    if isinstance(record, dict) and record.get("digest") is None:  # bytes or bare ids
        return None  # (a tokenizer.json there is not this run's)
    data = read_regular(found, "in the run directory", hint)
    if data is None:
        return None
    saved = record.get("digest") if isinstance(record, dict) else None
    if saved is not None and bytes_digest(data) != saved:
        raise UserError(f"`{found}` is not the tokenizer checkpoint `{checkpoint}` was "
                        f"trained with (digest {bytes_digest(data)}, recorded {saved}). "
                        f"{hint}")
    try:
        from tokenizers import Tokenizer

        HFTokenizer(Tokenizer.from_str(data.decode("utf-8")), "")
    except Exception as exc:  # noqa: BLE001 - tokenizers raises plain Exception
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise UserError(f"`{found}` is not a tokenizer ({why}). {hint}") from None
    return data


def _run_dir_of(checkpoint: Path) -> Path:
    return Path(checkpoint).resolve().parent.parent  # RUN/checkpoints/step-…


def _copy_tokenizer(checkpoint: Path, data: bytes | None, folder: Path) -> Path | None:
    """The run's tokenizer (`_run_tokenizer`) written beside the weights; None without."""
    from phalanx.paths import atomic_write

    target = folder / "tokenizer.json"
    if data is None:
        return None
    if target.resolve() != _run_dir_of(checkpoint) / "tokenizer.json":  # (exported into
        atomic_write(target, data)  # the run directory: it is there) a link there is
    return target  # replaced, not followed
