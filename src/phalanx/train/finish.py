"""What rank 0 says at the start and leaves behind at the end of `phalanx train`:
a banner, a text sample, `model.safetensors` + `config.json`, and a loss plot."""

from __future__ import annotations

import math
from typing import Any

import torch

from phalanx.checkpoint.export import export_weights
from phalanx.cluster.faults import fault_point
from phalanx.cluster.protocol import speaks_for_the_job
from phalanx.config.data_spec import resolve_spec
from phalanx.config.sections import Config
from phalanx.data import ByteTokenizer, TokenSplits
from phalanx.errors import UserError
from phalanx.models import build_model, model_name
from phalanx.models.adapter import Sampler
from phalanx.models.minigpt import MiniGPT
from phalanx.paths import RunDir, atomic_write
from phalanx.report.plots import plot_losses
from phalanx.report.run_report import build_report
from phalanx.runtime.run import Run, derive_seed
from phalanx.train.checkpointing import last_val_loss
from phalanx.train.state import TrainResult

SAMPLE_PROMPT = "def "  # the embedded corpus is Python source
OPTIMIZERS = {"adamw": "AdamW", "muon": "Muon (hidden matrices) + AdamW"}
PROMPT_BYTES = 16  # of the user's own text (see sample_prompt)


def banner(cfg: Config, run: Run, splits: TokenSplits) -> str:
    t, m = cfg.train, cfg.model
    gb = t.micro_batch_size * t.grad_accum * run.topology.dp_size
    return (f"phalanx: {run.world_size} rank(s) · {run.backend} on {run.device.type} · "
            f"strategy {run.strategy.label} · {run.threads} thread(s)/rank\n"
            f"model:   {model_name(cfg)}, block {m.block_size}, "
            f"precision {t.precision}, {OPTIMIZERS[t.optimizer]}\n"
            f"data:    {splits.description} ({splits.n_train:,} train / {splits.n_val:,} val "
            f"tokens; {splits.tokenizer_label})\n"
            f"batch:   {t.micro_batch_size} × {t.grad_accum} accum × {_data_ranks(run)} = "
            f"{gb} sequences = {gb * m.block_size:,} tokens/step, {t.max_steps} steps")


def _data_ranks(run: Run) -> str:
    """"4 ranks"; with tensor parallelism or pipeline stages, the ranks that see different
    data: "2 data-parallel ranks (tp 2 share each batch)", "(pp 2 × tp 2 share ...)"."""
    t = run.topology
    dp = t.dp_size
    if dp == run.world_size:
        return f"{dp} ranks"
    shared = " × ".join(f"{name} {mesh.size()}" for name, mesh in (("pp", t.pp_mesh),
                                                                   ("tp", t.tp_mesh))
                        if mesh is not None)
    return f"{dp} data-parallel ranks ({shared} share each batch)"


def sample_prompt(cfg: Config, splits: TokenSplits | None) -> str:
    """What the sample starts from: `def ` on the embedded Python corpus; on the user's
    own text (`--data`), the start of the first whole line of its validation split (up to
    PROMPT_BYTES, decoded with the run's tokenizer), or a newline."""
    if cfg.data.path is None:
        return SAMPLE_PROMPT
    tok = splits.tokenizer() if splits is not None else None
    if splits is None or tok is None:  # (token ids without a tokenizer: no text to show)
        return "\n"
    head = tok.decode(int(t) for t in splits.load("val")[:1024]).replace("\ufffd", "")
    lines = head.split("\n")
    line = next((x for x in lines[1:-1] if x.strip()), lines[0])  # not the line cut in two
    text = line.encode("utf-8")[:PROMPT_BYTES].decode("utf-8", "ignore")
    return text if text.strip() else "\n"


def sample_text(model: MiniGPT, cfg: Config, run: Run,
                splits: TokenSplits | None = None) -> str:
    """`sample_tokens` tokens generated from `sample_prompt`, decoded with the run's
    tokenizer; pre-tokenized data without a tokenizer file: the ids, said as such."""
    if cfg.train.sample_tokens <= 0:
        return ""
    tok = splits.tokenizer() if splits is not None else ByteTokenizer()
    ids = tok.encode(sample_prompt(cfg, splits)) if tok is not None else []
    if not ids:  # ids only, or a prompt the tokenizer drops: the validation split's first
        ids = [int(splits.load("val")[0])] if splits is not None else [ord("\n")]
    prompt = torch.tensor([ids], device=run.device)
    g = torch.Generator(device=run.device).manual_seed(derive_seed(cfg.train.seed, 0xA11CE))
    model.eval()
    out = model.generate(prompt, cfg.train.sample_tokens, generator=g)[0].tolist()
    if tok is None:
        return (f"(token ids: no tokenizer to decode them; pass the `tokenizer.json` they "
                f"were made with as `--tokenizer`)\n{' '.join(map(str, out))}")
    return tok.decode(out)


def _sample(model, cfg: Config, run: Run, splits: TokenSplits | None) -> str:
    """`sample_text` of MiniGPT, or of a `--model` factory's module through a generic
    loop over its forward (`Sampler`); a forward that cannot sample (e.g. it takes only
    `block_size` tokens) leaves a one-line note instead."""
    if cfg.model.factory is None:
        return sample_text(model, cfg, run, splits)
    sampler: Any = Sampler(model, cfg.model.block_size)  # generate() as MiniGPT's
    try:
        return sample_text(sampler, cfg, run, splits)
    except Exception as exc:  # noqa: BLE001 - the user's forward; the weights are written
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return (f"(no sample: `--model {cfg.model.factory}` could not generate text: "
                f"{type(exc).__name__}{': ' + first if first else ''})")


def finish(cfg: Config, run: Run, result: TrainResult, out: RunDir,
           splits: TokenSplits | None = None) -> None:
    """Every rank: gather the weights (a collective when sharded); rank 0 then writes
    them, samples text from them (prompted from `splits`' validation text) and plots the
    losses."""
    fault_point("export", result.state.step)
    weights = run.full_state_dict(result.model)
    if not run.is_main:
        return
    vocab = splits.vocab_size if splits is not None else 256
    model = build_model(cfg, vocab)  # a plain model, whatever the strategy did to the trained one
    model.load_state_dict(weights)  # (a factory's: its own names, as in the checkpoints)
    model.to(run.device)
    out = RunDir(out)
    label = splits.tokenizer_label if splits is not None else cfg.data.tokenizer
    export_weights(model, out.root, {"tokenizer": label, "phalanx": cfg.to_dict()})
    text = _sample(model, cfg, run, splits)
    says = speaks_for_the_job()  # torchft: one replica group says the results
    wrote = [out.model, out.model_config, out.metrics]
    tokenizer = splits.export_tokenizer(out.root) if splits is not None else None
    if tokenizer is not None:
        wrote.append(tokenizer)
    if text:
        atomic_write(out.sample, text)  # a link there is replaced, not followed
        if says:
            run.print(f"--- sample ---\n{text}\n--------------")
        wrote.append(out.sample)
    wrote.append(plot_losses(out.metrics, out.loss_plot, loss_unit(cfg, splits)))
    try:
        wrote.append(build_report(out.root))
    except UserError as exc:  # e.g. `report.html` is a directory: the model is written
        run.print(f"phalanx: warning: no report page: {exc}")
    wrote += [path for path in (out.tb, out.profile, out.logs) if path.is_dir()]
    if says:
        run.print(f"done: {result.state.step} steps, {result.state.tokens_seen:,} tokens, "
                  f"{final_losses(cfg, result, out, splits)}\n"
                  f"wrote: {', '.join(str(p) + ('/' if p.is_dir() else '') for p in wrote)}")


def loss_unit(cfg: Config, splits: TokenSplits | None) -> str:
    """The trainer's loss is cross-entropy per token in nats; a token is a byte with the
    bytes tokenizer."""
    kind = (splits.tokenizer_kind if splits is not None
            else resolve_spec(cfg.data.tokenizer, cfg.data.path))
    return "nats/byte" if kind == "bytes" else "nats/token"


def final_losses(cfg: Config, result: TrainResult, out: RunDir,
                 splits: TokenSplits | None) -> str:
    """`final val loss 1.4436 nats/byte (byte-uniform: 5.5452)`; with a tokenizer of V
    tokens, per token and per byte (what compares tokenizers) and the uniform guess."""
    def last(found: dict[int, float], key: str) -> float:
        value = (found[max(found)] if found  # (else: outputs written again, from metrics)
                 else last_val_loss(out, result.state.step, key))
        return float("nan") if value is None else value

    if not cfg.train.eval_every:
        return "no validation loss (`--eval-every 0`)"
    per_token = last(result.val_losses, "val_loss")
    vocab = splits.vocab_size if splits is not None else 256
    uniform = math.log(vocab)
    if loss_unit(cfg, splits) == "nats/byte":
        return f"final val loss {per_token:.4f} nats/byte (byte-uniform: {uniform:.4f})"
    per_byte = last(result.val_nats_per_byte, "val_nats_per_byte")
    shown = "" if math.isnan(per_byte) else f" = {per_byte:.4f} nats/byte"
    return (f"final val loss {per_token:.4f} nats/token{shown} · "
            f"{splits.tokenizer_label if splits is not None else cfg.data.tokenizer} · "
            f"uniform: {uniform:.4f} nats/token")
