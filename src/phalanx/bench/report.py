"""OUT/bench/report.md and its plots, from the raw results (results.json)."""

from __future__ import annotations

import statistics
from pathlib import Path

GOALS = {"plain": 1.00, "accelerate": 0.95, "fabric": 0.95}


def _ms(values: list[float]) -> str:
    return (f"{statistics.median(values) * 1e3:.1f} ({min(values) * 1e3:.1f}–"
            f"{max(values) * 1e3:.1f})")


def peers_table(res: dict) -> list[str]:
    times = res["peers"]
    tokens = res["tokens_per_step"]
    ours = statistics.median(times["phalanx"])
    lines = ["| implementation | ms/step, median (min–max) | tokens/s | Phalanx / it | goal |",
             "|---|---|---|---|---|"]
    for name, values in times.items():
        med = statistics.median(values)
        ratio = "—" if name == "phalanx" else f"**{ours / med:.3f}**"
        goal = f"<= {GOALS[name]:.2f}" if name in GOALS else ""
        lines.append(f"| {name} | {_ms(values)} | {tokens / med:,.0f} | {ratio} | {goal} |")
    return lines


def breakdown_table(prof: dict) -> list[str]:
    total = sum(prof["phases_ms"].values()) or 1.0
    lines = ["| phase | ms/step (rank 0, profiler) | share |", "|---|---|---|"]
    for phase in ("data", "forward", "backward", "optimizer"):
        ms = prof["phases_ms"].get(phase, 0.0)
        lines.append(f"| {phase} | {ms:.1f} | {ms / total:.0%} |")
    lines += ["", f"Exposed communication (step with the gradient all-reduce minus the same "
                  f"step without it, slowest rank, medians): {prof['step_ms']:.1f} − "
                  f"{prof['no_comm_step_ms']:.1f} = **{prof['exposed_comm_ms']:.1f} ms = "
                  f"{prof['exposed_comm_fraction']:.1%} of the step** (goal <= 5%)."]
    return lines


def scaling_table(scaling: dict) -> list[str]:
    lines = ["| sweep | ranks | global batch | ms/step (median) | tokens/s | efficiency |",
             "|---|---|---|---|---|---|"]
    for kind in ("weak", "strong"):
        rows = scaling.get(kind, [])
        base = next((r for r in rows if r["ranks"] == 1), None)
        for r in rows:
            eff = "—" if base is None else (
                r["tokens_per_s"] / (r["ranks"] * base["tokens_per_s"]) if kind == "weak"
                else base["ms"] / (r["ranks"] * r["ms"]))
            eff_text = eff if isinstance(eff, str) else f"**{eff:.1%}**"
            lines.append(f"| {kind} | {r['ranks']} | {r['global_batch']} | {r['ms']:.1f} | "
                         f"{r['tokens_per_s']:,.0f} | {eff_text} |")
    return lines


def render(res: dict) -> str:
    c = res["config"]
    lines = ["# phalanx bench", "",
             f"MiniGPT {c['model']['n_layer']} layers × {c['model']['n_embd']} wide, block "
             f"{c['model']['block_size']}, micro-batch {c['train']['micro_batch_size']} × "
             f"accumulation {c['train']['grad_accum']} per rank, {res['world_size']} rank(s) on "
             f"{res['device_name']}, {res['threads']} thread(s) per rank, precision "
             f"{c['train']['precision']}. Versions: "
             + ", ".join(f"{k} {v}" for k, v in res["versions"].items()) + ".",
             "", "## Throughput", ""]
    ours = statistics.median(res["peers"]["phalanx"])
    tps = res["tokens_per_step"] / ours
    lines.append(f"Phalanx: {ours * 1e3:.1f} ms/step, **{tps:,.0f} tokens/s**. FLOPs per "
                 f"token = 6·N + 12·n_layer·n_embd·block_size = {res['flops_per_token']:.3g} "
                 f"(N = {res['matmul_params']:,} matmul parameters).")
    lines.append(f"MFU = {res['mfu']:.1%} of {res['peak_flops'] / 1e12:.0f} TFLOP/s." if
                 res.get("mfu") is not None else "MFU: not reported on CPU (no peak table "
                 "entry); tokens/s only.")
    if len(res["peers"]) > 1:
        lines += ["", "## Side by side", "", f"{res['repeats']} blocks of {res['steps']} "
                  "steps each, alternating order, after warm-up; a block's time is the slowest "
                  "rank's.", ""] + peers_table(res) + ["", "![peers](peers.png)"]
    if res.get("profile"):
        lines += ["", "## Where a step's time goes", ""] + breakdown_table(res["profile"])
        lines += ["", "Chrome traces: `trace-rank<R>.json` (chrome://tracing, Perfetto)."]
    if res.get("scaling"):
        lines += ["", "## Scaling", "", "Weak: fixed per-rank batch, efficiency = tokens/s(n) "
                  "/ (n · tokens/s(1)). Strong: fixed global batch, efficiency = t(1) / "
                  "(n · t(n)).", ""] + scaling_table(res["scaling"])
    return "\n".join(lines) + "\n"


def plots(res: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    if len(res["peers"]) > 1:
        names = list(res["peers"])
        meds = [statistics.median(v) * 1e3 for v in res["peers"].values()]
        lows = [m - min(v) * 1e3 for m, v in zip(meds, res["peers"].values())]
        highs = [max(v) * 1e3 - m for m, v in zip(meds, res["peers"].values())]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.bar(names, meds, yerr=[lows, highs], capsize=4, color="#4c72b0")
        ax.set_ylabel("ms per step (median, min–max)")
        ax.set_title("The same training step, four ways")
        fig.tight_layout()
        fig.savefig(out / "peers.png", dpi=120)
        plt.close(fig)
        made.append(out / "peers.png")
    return made


def write(res: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    plots(res, out)
    path = out / "report.md"
    path.write_text(render(res))
    return path
