"""What rank 0 says at the start and leaves behind at the end of `phalanx train`:
a banner, a text sample, `model.safetensors` + `config.json`, and a loss plot."""

from __future__ import annotations

import os

import torch

from phalanx.checkpoint.export import export_weights
from phalanx.cluster.faults import fault_point
from phalanx.config.sections import Config
from phalanx.data import ByteTokenizer, TokenSplits
from phalanx.errors import UserError
from phalanx.models import build_model
from phalanx.models.minigpt import MiniGPT
from phalanx.paths import RunDir, atomic_write
from phalanx.report.plots import plot_losses
from phalanx.report.run_report import build_report
from phalanx.runtime.run import Run, derive_seed
from phalanx.train.checkpointing import last_val_loss
from phalanx.train.state import TrainResult

SAMPLE_PROMPT = "def "  # the embedded corpus is Python source
PROMPT_BYTES = 16  # of the user's own text (see sample_prompt)


def banner(cfg: Config, run: Run, splits: TokenSplits) -> str:
    t, m = cfg.train, cfg.model
    gb = t.micro_batch_size * t.grad_accum * run.topology.dp_size
    return (f"phalanx: {run.world_size} rank(s) · {run.backend} on {run.device.type} · "
            f"strategy {run.strategy.name} · {run.threads} thread(s)/rank\n"
            f"model:   MiniGPT {m.n_layer}L × {m.n_head}H × {m.n_embd}d, block {m.block_size}, "
            f"precision {t.precision}\n"
            f"data:    {splits.description} ({splits.n_train:,} train / {splits.n_val:,} val)\n"
            f"batch:   {t.micro_batch_size} × {t.grad_accum} accum × {run.world_size} ranks = "
            f"{gb} sequences = {gb * m.block_size:,} tokens/step, {t.max_steps} steps")


def sample_prompt(cfg: Config, splits: TokenSplits | None) -> str:
    """What the sample starts from: `def ` on the embedded Python corpus; on the user's
    own text (`--data`), the start of the first whole line of its validation split (up to
    PROMPT_BYTES), or a newline."""
    if cfg.data.path is None:
        return SAMPLE_PROMPT
    if splits is None:
        return "\n"
    lines = bytes(splits.load("val")[:1024]).split(b"\n")
    line = next((x for x in lines[1:-1] if x.strip()), lines[0])  # not the line cut in two
    text = line[:PROMPT_BYTES].decode("utf-8", "ignore")
    return text if text.strip() else "\n"


def sample_text(model: MiniGPT, cfg: Config, run: Run,
                splits: TokenSplits | None = None) -> str:
    if cfg.train.sample_tokens <= 0:
        return ""
    tok = ByteTokenizer()
    prompt = torch.tensor([tok.encode(sample_prompt(cfg, splits))], device=run.device)
    g = torch.Generator(device=run.device).manual_seed(derive_seed(cfg.train.seed, 0xA11CE))
    model.eval()
    out = model.generate(prompt, cfg.train.sample_tokens, generator=g)
    return tok.decode(out[0].tolist())


def missing_outputs(cfg: Config, out: RunDir) -> list[str]:
    """The files `finish` leaves in `out` that are not there (a run stopped while it
    wrote them): a complete run whose list is not empty writes them again."""
    out = RunDir(out)
    paths = [out.model, out.model_config, out.loss_plot, out.report]
    if cfg.train.sample_tokens > 0:
        paths.append(out.sample)
    # (exists: a `report.html` that is a directory was warned about, not rewritten forever)
    return [path.name for path in paths if not os.path.lexists(path)]


def finish(cfg: Config, run: Run, result: TrainResult, out: RunDir,
           splits: TokenSplits | None = None) -> None:
    """Every rank: gather the weights (a collective when sharded); rank 0 then writes
    them, samples text from them (prompted from `splits`' validation text) and plots the
    losses."""
    fault_point("export", result.state.step)
    weights = run.full_state_dict(result.model)
    if not run.is_main:
        return
    model = build_model(cfg)  # a plain MiniGPT, whatever the strategy did to the trained one
    model.load_state_dict(weights)
    model.to(run.device)
    out = RunDir(out)
    export_weights(model, out.root, {"phalanx": cfg.to_dict()})
    text = sample_text(model, cfg, run, splits)
    wrote = [out.model, out.model_config, out.metrics]
    if text:
        atomic_write(out.sample, text)  # a link there is replaced, not followed
        run.print(f"--- sample ---\n{text}\n--------------")
        wrote.append(out.sample)
    wrote.append(plot_losses(out.metrics, out.loss_plot))
    try:
        wrote.append(build_report(out.root))
    except UserError as exc:  # e.g. `report.html` is a directory: the model is written
        run.print(f"phalanx: warning: no report page: {exc}")
    wrote += [path for path in (out.tb, out.logs) if path.is_dir()]
    final = (result.val_losses[max(result.val_losses)] if result.val_losses
             else last_val_loss(out, result.state.step))  # (outputs written again)
    final = float("nan") if final is None else final
    run.print(f"done: {result.state.step} steps, {result.state.tokens_seen:,} tokens, "
              f"final val loss {final:.4f} (byte-uniform: 5.5452)\n"
              f"wrote: {', '.join(str(p) + ('/' if p.is_dir() else '') for p in wrote)}")
