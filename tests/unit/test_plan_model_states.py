"""`phalanx plan --model-states`: the ZeRO paper's Figure 1 (7.5 B parameters, 64 ranks,
mixed-precision Adam) to its rounding, and Phalanx's regimes agreeing with the
planner's per-strategy arithmetic (`plan.estimate` at the optimizer step)."""

from __future__ import annotations

import argparse
import io

import pytest
from rich.console import Console

from phalanx.plan import formulas as f
from phalanx.plan.estimate import VARIANTS, ModelFacts, moments
from phalanx.plan.model_states import (
    GB,
    paper_rows,
    parse_count,
    phalanx_rows,
    print_table,
    table,
)


def test_the_papers_figure_1_to_its_rounding():
    rows = paper_rows(7.5e9, 64)
    assert [r.regime for r in rows] == ["baseline (DDP)", "P_os", "P_os+g", "P_os+g+p"]
    assert [round(r.bytes_per_rank / GB, 1) for r in rows] == [120.0, 31.4, 16.6, 1.9]


def test_phalanx_regimes_fp32_master_parameters():
    ddp, zero, fsdp = phalanx_rows(7.5e9, 64)
    assert ddp.bytes_per_rank == 16 * 7.5e9  # 4Ψ + 4Ψ + 8Ψ: the paper's baseline, fp32
    assert zero.bytes_per_rank == 8 * 7.5e9 + 8 * 7.5e9 / 64  # not the paper's 4Ψ + 12Ψ/N
    assert round(zero.bytes_per_rank / GB, 1) == 60.9
    assert fsdp.bytes_per_rank == 16 * 7.5e9 / 64
    muon = phalanx_rows(1e9, 8, "muon", muon_share=1.0)
    assert [r.bytes_per_rank for r in muon] == [12e9, 8e9 + 4e9 / 8, 12e9 / 8]  # 1 copy


def _facts(W: int, hidden: int) -> ModelFacts:
    """W·2 equal (W·4, 8) matrices — ZeRO's whole-parameter partition balances them,
    FSDP's dim-0 shards divide evenly — the first `hidden` stepped by Muon."""
    shapes = [(W * 4, 8)] * (2 * W)
    copies = tuple(f.MUON_COPIES if i < hidden else f.ADAMW_COPIES
                   for i in range(len(shapes)))
    groups = tuple(0 if i < hidden else 1 for i in range(len(shapes)))
    return ModelFacts(shapes, [], [], 0, block_saved=0, block_input=0, head_saved=0,
                      logits=0, loss_grads=0, block_grads_in_flight=0,
                      state_copies=copies, optim_groups=groups)


@pytest.mark.parametrize("optimizer,hidden", [("adamw", 0), ("muon", 8), ("muon", 16)])
def test_phalanx_rows_agree_with_the_planners_arithmetic(optimizer, hidden):
    W = 8
    facts = _facts(W, hidden)
    n = sum(map(f.numel, facts.param_shapes))
    rows = {r.regime: r.bytes_per_rank
            for r in phalanx_rows(n, W, optimizer, muon_share=hidden / len(
                facts.param_shapes))}
    for v in VARIANTS:
        if not v.reshard:
            continue  # reshard changes what is gathered, not the model states
        step = moments(facts, v, W, checkpointed=False)["optimizer step"]
        states = step["parameters"] + step["gradients"] + step["optimizer"]
        assert states == pytest.approx(rows[v.strategy]), v.label


def test_parse_count_and_the_table():
    assert parse_count("7.5e9") == parse_count("7.5B") == 7.5e9
    assert parse_count("124M") == 124e6 and parse_count("1_000") == 1000
    for bad in ("7.5x", "-3", "0", "", "nan", "inf"):
        with pytest.raises(argparse.ArgumentTypeError, match="parameter count"):
            parse_count(bad)
    buf = io.StringIO()
    print_table(table(7.5e9, 64), Console(file=buf, width=80))
    text = buf.getvalue()
    for label, gb in (("baseline (DDP)", "120.0"), ("P_os ", "31.4"), ("P_os+g ", "16.6"),
                      ("P_os+g+p", "1.9"), ("ddp ", "120.0"), ("zero ", "60.9"),
                      ("fsdp ", "1.9")):
        line = next(x for x in text.splitlines() if x.strip().startswith(label.strip() + " "))
        assert line.rstrip().endswith(gb), line
    buf = io.StringIO()  # with Muon: the AdamW rows first (the paper's optimizer), then its
    print_table(table(7.5e9, 64, "muon", 1.0), Console(file=buf, width=80))
    text = buf.getvalue()
    assert text.index("Phalanx with AdamW") < text.index("Phalanx with Muon")
    zero = [x for x in text.splitlines() if x.strip().startswith("zero ")]
    assert [z.split()[-1] for z in zero] == ["60.9", "60.5"], zero  # 8Ψ+8Ψ/N; 8Ψ+4Ψ/N


def test_the_cli_prints_it_and_params_needs_model_states(capsys):
    import json

    from phalanx.cli.dispatch import main

    argv = ["plan", "--model-states", "--params", "7.5B", "--world-size", "64",
            "--optimizer", "adamw", "--json"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    gb = {r["regime"]: round(r["bytes_per_rank"] / GB, 1) for r in result["rows"]}
    assert gb == {"baseline (DDP)": 120.0, "P_os": 31.4, "P_os+g": 16.6, "P_os+g+p": 1.9,
                  "ddp": 120.0, "zero": 60.9, "fsdp": 1.9}
    assert main(["plan", "--model-states", "--world-size", "8", "--preset", "gpt2-124m",
                 "--optimizer", "muon", "--json"]) == 0
    muon = json.loads(capsys.readouterr().out)
    assert muon["parameters"] == 124_439_808 and 0.5 < muon["muon_share"] < 0.8
    assert main(["plan", "--params", "7.5e9"]) == 2
    assert "add `--model-states`" in capsys.readouterr().err
