"""OUT/bench/report.md and its plots, from the raw results (results.json). Each is
written whole through `paths.atomic_write`: a link planted at its name is replaced, never
written through; a link at OUT/bench itself is refused (`paths.ensure_dir`)."""

from __future__ import annotations

import io
import statistics
from pathlib import Path

from phalanx.bench import flops, stats
from phalanx.paths import atomic_write, ensure_dir
from phalanx.report.charts import new_figure

GOALS = {"plain": 1.00, "accelerate": 0.95, "fabric": 0.95}  # no goal for strategy baselines


def _ms(values: list[float]) -> str:
    return (f"{statistics.median(values) * 1e3:.1f} ({min(values) * 1e3:.1f}–"
            f"{max(values) * 1e3:.1f})")


def _ratio(ours: list[float], theirs: list[float]) -> tuple[str, tuple[float, float, float]]:
    mid, low, high = stats.ratio_interval(ours, theirs)
    return f"**{mid:.3f}** ({low:.3f}–{high:.3f})", (mid, low, high)


def peers_table(res: dict) -> list[str]:
    times = res["peers"]
    tokens = res["tokens_per_step"]
    ours = times["phalanx"]
    lines = ["| implementation | ms/step, median (min–max) | tokens/s | Phalanx / it, paired "
             "median (95% CI) | goal | verdict |", "|---|---|---|---|---|---|"]
    for name, values in times.items():
        med = statistics.median(values)
        ratio, verdict = "—", ""
        if name != "phalanx":
            ratio, (_, low, high) = _ratio(ours, values)
            verdict = stats.verdict(low, high, GOALS[name]) if name in GOALS else ""
        goal = f"<= {GOALS[name]:.2f}" if name in GOALS else ""
        lines.append(f"| {name} | {_ms(values)} | {tokens / med:,.0f} | {ratio} | {goal} | "
                     f"{verdict} |")
    return lines


def defaults_table(res: dict) -> list[str]:
    ours = res["peers"]["phalanx"]
    lines = ["| setting | Phalanx | torch's default | ms/step with torch's, median (min–max) "
             "| Phalanx / torch's, paired median (95% CI) |", "|---|---|---|---|---|"]
    for d in res["defaults"]:
        ratio, (_, low, high) = _ratio(ours, d["times"])
        effect = " faster" if high < 1 else " slower" if low > 1 else ""
        lines.append(f"| {d['setting']} | {d['ours']} | {d['torch']} | {_ms(d['times'])} | "
                     f"{ratio}{effect} |")
    return lines


def breakdown_table(prof: dict) -> list[str]:
    total = sum(prof["phases_ms"].values()) or 1.0
    lines = ["| phase | ms/step (rank 0, profiler) | share |", "|---|---|---|"]
    for phase in ("data", "forward", "backward", "optimizer"):
        ms = prof["phases_ms"].get(phase, 0.0)
        lines.append(f"| {phase} | {ms:.1f} | {ms / total:.0%} |")
    if prof.get("collectives_ms"):
        lines += ["", "| communication (profiler, rank 0) | ms/step |", "|---|---|"]
        lines += [f"| `{k}` | {v:.1f} |" for k, v in prof["collectives_ms"].items()]
    if "step_ms" not in prof:
        return lines + ["", "A sharded step cannot run without its all-gathers, so exposed "
                            "communication is not measured by ablation; the table above is "
                            "where its communication time goes (nested phases overlap)."]
    lines += ["", f"Exposed communication (step with the gradient all-reduce minus the same "
                  f"step without it, slowest rank, medians): {prof['step_ms']:.1f} − "
                  f"{prof['no_comm_step_ms']:.1f} = **{prof['exposed_comm_ms']:.1f} ms = "
                  f"{prof['exposed_comm_fraction']:.1%} of the step** (goal <= 5%)."]
    if "allreduce_alone_ms" in prof:
        lines += ["", f"What it is made of: one all-reduce of every gradient on its own takes "
                      f"{prof['allreduce_alone_ms']:.1f} ms (ranks lined up, nothing else "
                      f"running); waiting for the slower rank, estimated on steps that do not "
                      f"synchronise (mean over steps of slowest − mean rank time): "
                      f"{prof['rank_wait_ms']:.1f} ms. The estimate can exceed the exposed "
                      f"time: a rank waiting idle stops competing for the machine."]
    return lines


def scaling_table(scaling: dict) -> list[str]:
    lines = ["| sweep | ranks | global batch | ms/step (median) | tokens/s | efficiency, paired "
             "median (95% CI) | goal |", "|---|---|---|---|---|---|---|"]
    for kind in ("weak", "strong"):
        for r in scaling.get(kind, []):
            mid, low, high = r["efficiency"]
            goal = ">= 95%" if kind == "weak" and r["ranks"] > 1 else ""
            lines.append(f"| {kind} | {r['ranks']} | {r['global_batch']} | {r['ms']:.1f} | "
                         f"{r['tokens_per_s']:,.0f} | **{mid:.1%}** ({low:.1%}–{high:.1%}) | "
                         f"{goal} |")
    return lines


def render(res: dict) -> str:
    c = res["config"]
    lines = ["# phalanx bench", "",
             f"MiniGPT {c['model']['n_layer']} layers × {c['model']['n_embd']} wide, block "
             f"{c['model']['block_size']}, micro-batch {c['train']['micro_batch_size']} × "
             f"accumulation {c['train']['grad_accum']} per rank, {res['world_size']} rank(s) "
             f"({res.get('strategy', 'default strategy')}) on "
             f"{res['device_name']}, {res['threads']} thread(s) per rank, precision "
             f"{c['train']['precision']}. Versions: "
             + ", ".join(f"{k} {v}" for k, v in res["versions"].items()) + ".",
             ""]
    if res.get("stopped"):
        lines += [f"**Stopped early (Ctrl-C): {res['repeats']} complete round(s) of the "
                  f"{res.get('repeats_asked', '?')} asked for; no profile or scaling.** "
                  "Fewer rounds give wider intervals.", ""]
    lines += ["## Throughput", ""]
    ours = statistics.median(res["peers"]["phalanx"])
    tps = res["tokens_per_step"] / ours
    lines.append(f"Phalanx: {ours * 1e3:.1f} ms/step, **{tps:,.0f} tokens/s**. FLOPs per "
                 f"token = 6·N + 12·n_layer·n_embd·block_size = {res['flops_per_token']:.3g} "
                 f"(N = {res['matmul_params']:,} matmul parameters).")
    lines.append(f"MFU = {res['mfu']:.1%} of {res['peak_flops'] / 1e12:.0f} TFLOP/s." if
                 res.get("mfu") is not None else
                 flops.no_mfu_reason(res.get("device_name", "CPU")))
    if len(res["peers"]) > 1:
        lines += ["", "## Side by side", "", f"{res['repeats']} blocks of {res['steps']} "
                  "steps each, alternating order, after warm-up; a block's time is the slowest "
                  "rank's. Ratios are paired by round (the blocks of one round ran back to "
                  "back) with a bootstrap 95% interval; the verdict is *met* or *missed* only "
                  "when the whole interval is on one side of the goal.", ""]
        lines += peers_table(res) + ["", "![peers](peers.png)"]
    if res.get("defaults"):
        lines += ["", "## Defaults, measured", "", "Phalanx's step with one setting put back "
                  "to torch's default, timed in the same rounds. Below 1: Phalanx's default "
                  "is faster here.", ""] + defaults_table(res)
    if res.get("profile"):
        lines += ["", "## Where a step's time goes", ""] + breakdown_table(res["profile"])
        lines += ["", "Chrome traces: `trace-rank<R>.json` (chrome://tracing, Perfetto)."]
    if res.get("scaling"):
        lines += ["", "## Scaling", "", "All sizes in one launch, interleaved (ranks beyond n "
                  "wait idle). Weak: fixed per-rank batch, efficiency = t(1) / t(n). Strong: "
                  "fixed global batch, efficiency = t(1) / (n · t(n)). Paired by round, "
                  "bootstrap 95% interval.", ""] + scaling_table(res["scaling"])
        lines += ["", "![scaling](scaling.png)"]
    return "\n".join(lines) + "\n"


def peers_plot(res: dict, path: Path) -> None:
    names = list(res["peers"])
    meds = [statistics.median(v) * 1e3 for v in res["peers"].values()]
    lows = [m - min(v) * 1e3 for m, v in zip(meds, res["peers"].values())]
    highs = [max(v) * 1e3 - m for m, v in zip(meds, res["peers"].values())]
    fig = new_figure((6, 3.5))
    ax = fig.subplots()
    ax.bar(names, meds, yerr=[lows, highs], capsize=4, color="#4c72b0")
    ax.set_ylabel("ms per step (median, min–max)")
    ax.set_title("The same training step, four ways")
    fig.tight_layout()
    _save(fig, path)


def scaling_plot(scaling: dict, path: Path) -> None:
    """Efficiency against ranks, weak and strong (95% intervals), with the goal line."""
    fig = new_figure((6, 3.5))
    ax = fig.subplots()
    for kind, marker in (("weak", "o"), ("strong", "s")):
        rows = scaling.get(kind, [])
        ax.errorbar([r["ranks"] for r in rows], [r["efficiency"][0] * 100 for r in rows],
                    yerr=[[(r["efficiency"][0] - r["efficiency"][1]) * 100 for r in rows],
                          [(r["efficiency"][2] - r["efficiency"][0]) * 100 for r in rows]],
                    marker=marker, capsize=4, label=kind)
    ax.axhline(95, color="grey", linestyle="--", linewidth=1, label="95% goal (weak)")
    ax.set_xlabel("ranks")
    ax.set_ylabel("scaling efficiency, %")
    ax.set_ylim(0, 110)
    ax.legend()
    fig.tight_layout()
    _save(fig, path)


def _save(fig, path: Path) -> None:
    """The figure as PNG at `path` (matplotlib would open the name: through a link)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    atomic_write(path, buf.getvalue())


def plots(res: dict, out: Path) -> None:
    if len(res["peers"]) > 1:
        peers_plot(res, out / "peers.png")
    if res.get("scaling"):
        scaling_plot(res["scaling"], out / "scaling.png")


def plots_of(out: Path) -> list[Path]:
    """The plots `write` made in `out`."""
    return [out / name for name in ("peers.png", "scaling.png") if (out / name).is_file()]


def write(res: dict, out: Path) -> Path:
    ensure_dir(out, "where `phalanx bench` writes")
    plots(res, out)
    return atomic_write(out / "report.md", render(res))
