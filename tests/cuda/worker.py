"""The CUDA tier's scenarios, each run in a process of its own (an NCCL process group,
CUDA's allocator statistics and torch.compile's caches start clean):

    python tests/cuda/worker.py SCENARIO OUT.json ['{"option": value}']

writes the scenario's result as JSON to OUT.json. The tests (and benchmarks/gpu_suite.py)
start it and check what it wrote. Importable without a GPU: torch and Phalanx are
imported inside the scenarios.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

GPT2_VOCAB = 50257  # the gpt2-124m preset's tokenizer (bpe:50257)


def config(model: dict | None = None, **train: Any):
    """A validated Config: `model` (default the gpt2-124m preset), bf16, AdamW."""
    from phalanx.config.sections import build_config

    train = {"precision": "bf16", "optimizer": "adamw", "lr": 6e-4, "warmup_steps": 0, **train}
    return build_config({"model": model or {"preset": "gpt2-124m"}, "train": train})


def random_batches(vocab: int, batch: int, block: int, device, seed: int = 0):
    """(x, y) of random tokens, the same sequence for every caller with `seed`."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    while True:
        x = torch.randint(0, vocab, (batch, block), generator=gen).to(device)
        yield x, torch.roll(x, -1, 1)


def counting_batches(batch: int, block: int, device, period: int = 64):
    """(x, y) where each row counts up from a random start, modulo `period`: the next
    token follows from the current one, so the loss falls within a few dozen steps."""
    import torch

    gen = torch.Generator().manual_seed(0)
    while True:
        start = torch.randint(0, period, (batch, 1), generator=gen)
        x = ((start + torch.arange(block)) % period).to(device)
        yield x, torch.roll(x, -1, 1)


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def setup(run, cfg, vocab: int):
    """The trainer's model and optimizer, wrapped by the run's strategy."""
    from phalanx.models import build_model
    from phalanx.runtime.optim import make_optimizer

    net = build_model(cfg, vocab)
    return run.setup(net, lambda params: make_optimizer(cfg, net, params, run.device, vocab),
                     precision=cfg.train.precision)


def nccl_version() -> str:
    import torch

    v = torch.cuda.nccl.version()  # a tuple; an int in old torch
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def pinning() -> dict:
    """phalanx.init under the launcher's variables the test set: backend, device, pin."""
    import torch
    import torch.distributed as dist

    import phalanx

    with phalanx.init(seed=0) as run:
        t = torch.full((1234,), 2.0, device=run.device)
        total = run.all_reduce_sum(t)
        torch.cuda.synchronize()
        return {"backend": run.backend, "pg_backend": str(dist.get_backend()),
                "device": str(run.device), "current_device": torch.cuda.current_device(),
                "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
                "sum": float(total[0]), "tensor_device": str(total.device),
                "nccl": nccl_version(),
                "device_name": torch.cuda.get_device_name()}


def strategy_steps(strategy: str, steps: int, state_path: str) -> dict:
    """`steps` bf16 optimizer steps of the `small` preset under `strategy` (world size
    1) on counting sequences: losses, the dtypes FSDP's policy gives, the final weights
    (written to `state_path` for the test to compare)."""
    import torch

    import phalanx
    from phalanx.runtime.train_step import micro_steps, optimizer_step

    cfg = config({"preset": "small"}, micro_batch_size=8, lr=2e-3)
    with phalanx.init(seed=cfg.train.seed, strategy=strategy) as run:
        model, opt = setup(run, cfg, 4096)
        seen: dict[str, str] = {}
        linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))

        def note(mod, _) -> None:  # the weight a forward computes with
            seen.setdefault("forward_weight", str(mod.weight.dtype))
        hook = linear.register_forward_pre_hook(note)
        data = counting_batches(8, cfg.model.block_size, run.device)
        losses, acc = [], run.accumulate(model, 1)
        for _ in range(steps):
            loss = micro_steps(model, acc, data, run.precision)
            seen.setdefault("grad", str(next(p.grad.dtype for p in model.parameters()
                                             if p.grad is not None)))
            optimizer_step(run, model, opt, cfg.train.grad_clip)
            losses.append(loss.item())
        hook.remove()
        state = {k: v.detach().float().cpu() for k, v in run.full_state_dict(model).items()}
        torch.save(state, state_path)
        return {"strategy": run.strategy.name, "losses": losses,
                "param": str(next(model.parameters()).dtype), **seen}


def sdpa() -> dict:
    """gpt2-124m's forward and backward with SDPA restricted to each fused kernel (an
    error if it cannot run), compared with the math kernel's on every attention output
    and gradient (`compare.kernel_mismatches`), and which kernels run when torch chooses
    (the profiler's CUDA kernel names)."""
    import functools

    import torch
    from compare import attention_and_grads, kernel_mismatches, relative_errors
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from phalanx.models import build_model

    model = build_model(config(), GPT2_VOCAB).cuda()
    x, y = next(random_batches(GPT2_VOCAB, 4, 1024, "cuda"))
    out: dict[str, Any] = {}
    for dtype in (torch.bfloat16, torch.float16):
        math = attention_and_grads(model, x, y, functools.partial(
            sdpa_kernel, [SDPBackend.MATH]), dtype)
        out[f"math/{str(dtype)[6:]}"] = {"ok": True, "loss": float(math["loss"])}
        for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION"):
            key = f"{name.lower()}/{str(dtype)[6:]}"
            try:
                got = attention_and_grads(model, x, y, functools.partial(
                    sdpa_kernel, [getattr(SDPBackend, name)]), dtype)
            except RuntimeError as exc:
                out[key] = {"ok": False, "error": str(exc)[:400]}
                continue
            out[key] = {"ok": True, "loss": float(got["loss"]),
                        "mismatches": kernel_mismatches(got, math, dtype),
                        "worst": max(relative_errors(got, math).values())}
    out["default_kernels"] = _attention_kernels(model, x, y)
    return out


def _attention_kernels(model, x, y) -> list[str]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = model(x, y)
        loss.backward()
        torch.cuda.synchronize()
    words = ("flash", "fmha", "attention", "sdpa", "cudnn", "efficient")
    return sorted({e.key for e in prof.key_averages() if any(w in e.key.lower() for w in words)})


def compiled(steps: int) -> dict:
    """The trainer (`train.loop.train`) on the embedded corpus, `small` preset, bytes,
    bf16, eager then with `--compile`: both losses; and a fullgraph compile of the
    model's forward (an error names the graph break)."""
    import phalanx
    from phalanx.data.corpus import prepare
    from phalanx.train.loop import train

    splits = prepare(None, tempfile.mkdtemp(prefix="phalanx-gpu-"), 0.05, lambda *a: None)
    out: dict[str, Any] = {}
    for flag in (False, True):
        cfg = config({"preset": "small"}, max_steps=steps, compile=flag, log_every=1,
                     eval_every=steps, eval_batches=1, sample_tokens=0)
        with phalanx.init(seed=cfg.train.seed) as run:
            t0 = time.perf_counter()
            result = train(cfg, run, splits)
            _sync()
            out["compiled" if flag else "eager"] = {"losses": result.losses,
                                                    "seconds": time.perf_counter() - t0}
    out["fullgraph"] = _fullgraph()
    return out


def _fullgraph() -> dict:
    import torch

    from phalanx.models import build_model

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = build_model(config({"preset": "small"}), 256).to(device)
    x, y = next(random_batches(256, 2, 256, device))
    try:
        with torch.autocast(device, dtype=torch.bfloat16):
            torch.compile(model, fullgraph=True)(x, y)
        return {"ok": True}
    except Exception as exc:  # a graph break, or an inductor failure: say which
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:600]}"}


def measured(steps: int, micro_batch_size: int) -> dict:
    """`phalanx plan --measure`'s figure (torch's MemTracker, in `plan.measure.measure`)
    beside the CUDA allocator's own peak over the same steps."""
    import torch

    from phalanx.plan.measure import join, measure

    cfg = config(micro_batch_size=micro_batch_size, optimizer="muon")
    run = join(cfg, "single")
    try:
        torch.cuda.reset_peak_memory_stats()
        mine = measure(run, cfg, steps)
        torch.cuda.synchronize()
        return {**mine, "cuda_max_allocated": torch.cuda.max_memory_allocated(),
                "cuda_max_reserved": torch.cuda.max_memory_reserved()}
    finally:
        run.close()


def checkpoint_stall(root: str, preset: str = "gpt2-124m") -> dict:
    """gpt2-124m + AdamW state: a synchronous save, then async saves (pinned staging
    buffers), copy-first and overlapped; each save's stall (`run.checkpoint_timings`)."""
    import phalanx
    from phalanx.runtime.train_step import micro_steps, optimizer_step

    cfg = config({"preset": preset}, micro_batch_size=4)
    with phalanx.init(seed=0) as run:
        model, opt = setup(run, cfg, GPT2_VOCAB)
        data = random_batches(GPT2_VOCAB, 4, cfg.model.block_size, run.device)
        acc = run.accumulate(model, 1)

        def step() -> None:
            micro_steps(model, acc, data, run.precision)
            run.checkpoint_staged()
            optimizer_step(run, model, opt, 1.0)

        step()  # optimizer state exists
        out: dict[str, Any] = {"bytes": _state_bytes(model, opt)}
        background = {"asynchronous": True}
        # untimed first saves (directories, the background group, the pinned buffers'
        # allocation), then one timed save of each kind; the last of a name is kept
        modes = [("sync", {}), ("sync", {}), ("async", background), ("async", background),
                 ("overlap", {**background, "overlap_staging": True})]
        for i, (mode, kwargs) in enumerate(modes):
            _sync()
            run.save(root, i + 1, model, opt, keep=2, **kwargs)
            step()
            run.wait_checkpoint()
            out[f"{mode}_stall_s"] = run.checkpoint_timings["stall"]
        buffers = run._saver._staging._buffers.values()  # the stager's (test-only peek)
        out["staging_buffers"] = len(buffers)
        out["all_pinned"] = bool(buffers) and all(b.is_pinned() for b in buffers)
        return out


def _state_bytes(model, opt) -> int:
    import torch

    tensors = [*model.parameters(), *(v for s in opt.state.values() for v in s.values()
                                      if isinstance(v, torch.Tensor))]
    return sum(t.numel() * t.element_size() for t in tensors)


def flight() -> dict:
    """An NCCL all_reduce with the flight recorder on (TORCH_NCCL_TRACE_BUFFER_SIZE, set
    by the test), then this rank's own dump as the hang report reads it."""
    import torch

    import phalanx
    from phalanx.hang import flight_recorder as fr

    with phalanx.init(seed=0) as run:
        run.all_reduce_sum(torch.ones(1234, device=run.device))
        torch.cuda.synchronize()
        time.sleep(2.0)  # NCCL's watchdog thread marks entries completed as it polls
        dump = fr.own_dump()
        last = None if dump is None else fr.last_collective(dump, run.rank, "in-process")
        return {"dumped": dump is not None, "version": None if dump is None else
                dump.get("version"), "entries": 0 if dump is None else len(dump["entries"]),
                "last": None if last is None else last.__dict__,
                "section": fr.section(1, {run.rank: None if last is None else last.__dict__})}


def throughput(steps: int = 30, warmup: int = 10, micro_batch_size: int = 8,
               compile: bool = False, preset: str = "gpt2-124m") -> dict:
    """Training tokens/s of `preset` in bf16 (the trainer's step, random tokens), the
    model FLOPs per token (bench.flops: 6N + 12·L·C·T) and MFU against this device's own
    dense bf16 peak (runtime.peaks; None for a device not in its table)."""
    import torch

    import phalanx
    from phalanx.bench.flops import flops_per_token, matmul_params
    from phalanx.runtime import peaks
    from phalanx.runtime.train_step import micro_steps, optimizer_step

    cfg = config({"preset": preset}, micro_batch_size=micro_batch_size, optimizer="muon")
    m = cfg.model
    with phalanx.init(seed=0) as run:
        model, opt = setup(run, cfg, GPT2_VOCAB)
        forward = torch.compile(model) if compile else model  # as train.loop does
        data = random_batches(GPT2_VOCAB, micro_batch_size, m.block_size, run.device)
        acc = run.accumulate(model, 1)
        for i in range(warmup + steps):
            if i == warmup:
                _sync()
                t0 = time.perf_counter()
            micro_steps(forward, acc, data, run.precision)
            optimizer_step(run, model, opt, cfg.train.grad_clip)
        _sync()
        seconds = time.perf_counter() - t0
        cuda = torch.cuda.is_available()
        name = torch.cuda.get_device_name() if cuda else "CPU"
        per_token = flops_per_token(matmul_params(run.unwrap(model)), m.n_layer, m.n_embd,
                                    m.block_size)
        tps = steps * micro_batch_size * m.block_size / seconds
        peak = peaks.peak_for(name)
        return {"device_name": name, "preset": preset, "compile": compile,
                "micro_batch_size": micro_batch_size, "tokens_per_s": tps,
                "step_s": seconds / steps, "flops_per_token": per_token,
                "peak_flops": None if peak is None else peak.bf16_flops,
                "peak_row": None if peak is None else peak.device,
                "mfu": peaks.mfu(tps, per_token, name),
                "no_mfu_reason": None if peak is not None else peaks.unknown_reason(name),
                "max_allocated": torch.cuda.max_memory_allocated() if cuda else None}


SCENARIOS: dict[str, Callable[..., dict]] = {
    "throughput": throughput,
    "pinning": pinning, "strategy_steps": strategy_steps, "sdpa": sdpa,
    "compiled": compiled, "measured": measured, "checkpoint_stall": checkpoint_stall,
    "flight": flight,
}


def main(argv: list[str]) -> int:
    name, out = argv[0], Path(argv[1])
    options = json.loads(argv[2]) if len(argv) > 2 else {}
    result = SCENARIOS[name](**options)
    out.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
