"""`phalanx plan --pp P --dp-shard S` (issue 44, plan.pipeline): a pipeline row beside the
1-D ones — each stage's part of MiniGPT, its micro-batches in flight per schedule, the
highest stage's peak, and the step stretched by the bubble. `--measure` checks the row
against torch's memory tracker on 4 gloo ranks (tests/e2e/test_plan_layouts.py)."""

from __future__ import annotations

import json

from phalanx import cli
from phalanx.config.flags import resolve
from phalanx.plan import formulas as f
from phalanx.plan.estimate import pipeline_variant
from phalanx.plan.pipeline import bubble, in_flight, pipeline_peak, stage_facts
from phalanx.plan.recommend import facts_for, planned_vocab

SHAPE = ["--n-layer", "4", "--n-embd", "64", "--n-head", "2", "--block-size", "64",
         "--no-tie-embeddings"]


def config(*argv: str):
    return resolve(cli.build_parser().parse_args(["plan", *SHAPE, *argv]))


def test_the_schedules_micro_batches_in_flight_and_the_bubble():
    # GPipe: every forward before any backward; 1F1B: torch's warm-up, min(M, P - s)
    assert [in_flight("gpipe", 4, s, 8) for s in range(4)] == [8, 8, 8, 8]
    assert [in_flight("1f1b", 4, s, 8) for s in range(4)] == [4, 3, 2, 1]
    assert [in_flight("1f1b", 4, s, 2) for s in range(4)] == [2, 2, 2, 1]
    assert bubble(2, 4) == 1 / 5 and bubble(4, 4) == 3 / 7 and bubble(1, 4) == 0


def test_the_stages_hold_the_whole_model_between_them():
    cfg = config("--n-layer", "5")
    vocab = planned_vocab(cfg)[0]
    facts = facts_for(cfg)
    stages = [stage_facts(facts, cfg, vocab, 3, s) for s in range(3)]
    assert [s.n_blocks for s in stages] == [2, 2, 1]  # the first stages one more
    assert sum(sum(map(f.numel, s.param_shapes)) for s in stages) == \
        sum(map(f.numel, facts.param_shapes))
    # the embedding on the first stage, the head's tensors on the last only
    assert (vocab, 64) in stages[0].root_shapes and (vocab, 64) in stages[2].root_shapes
    assert stages[1].root_shapes == [] and stages[0].logits == stages[1].loss_grads == 0
    assert stages[2].logits == facts.logits and stages[2].head_saved == facts.head_saved


def test_gpipe_holds_more_than_1f1b_once_the_micro_batches_outnumber_the_stages():
    cfg = config("--grad-accum", "8")
    vocab, facts = planned_vocab(cfg)[0], facts_for(cfg)
    gpipe = pipeline_peak(facts, cfg, vocab, pipeline_variant(2, "gpipe", 1, 2), 4)
    one_f_one_b = pipeline_peak(facts, cfg, vocab, pipeline_variant(2, "1f1b", 1, 2), 4)
    assert gpipe["activations"] > 2 * one_f_one_b["activations"], (gpipe, one_f_one_b)
    assert gpipe["moment"].startswith("stage 1: ")  # the logits' stage, with this vocabulary


def test_the_plan_shows_the_pipeline_row_with_its_bubble(capsys):
    argv = ["plan", *SHAPE, "--world-size", "8", "--gpu", "h100", "--json", "--pp", "2",
            "--dp-shard", "4", "--grad-accum", "4"]
    assert cli.main(argv) == 0
    rows = {r["strategy"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert list(rows) == ["ddp", "zero", "fsdp", "fsdp (no reshard)",
                          "pp 2 (1f1b) × dp_shard 4"]
    pp = rows["pp 2 (1f1b) × dp_shard 4"]
    t = pp["time"]
    # M = 4 micro-batches take M + P - 1 = 5 slots: one of them idle
    assert abs(t["bubble_s"] - (t["compute_s"] - t["bubble_s"]) / 4) < 1e-12, t
    assert t["step_s"] > t["compute_s"] > 0 and pp["largest_micro_batch"] > 0
    assert pp["stage"] in (0, 1) and pp["moment"].startswith(f"stage {pp['stage']}: ")
    # sharded over a stage's 4 ranks: less optimizer state than ddp's whole model
    assert pp["optimizer"] < rows["ddp"]["optimizer"] / 4


def test_what_the_pipeline_plan_does_not_model_is_one_line(capsys):
    for extra, said in ((["--simulate"], "`--simulate` does not run pipeline stages yet"),
                        (["--model-states"], "`--model-states` is the data-parallel regimes"),
                        (["--activation-checkpointing"], "`--activation-checkpointing` is "
                                                         "not planned under pipeline stages"),
                        (["--tie-embeddings"], "pipeline stages cannot share a weight")):
        argv = ["plan", *SHAPE, "--world-size", "4", "--pp", "2", "--grad-accum", "2", *extra]
        assert cli.main(argv) == 2, extra
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], (extra, err)


def test_a_pipeline_rows_step_is_compared_for_the_same_global_batch():
    """A pp P row's step runs 1/P of the others' global batch (P ranks per data-parallel
    batch): its 0.6 s counts as 1.2 s beside a 1-D row's 1.0 s."""
    from phalanx.plan.recommend import recommend

    def row(name, pp, step):
        return {"strategy": name, "tp": 1, "pp": pp, "fits": True, "peak": 1,
                "largest_micro_batch": 8, "time": {"step_s": step, "comm_bytes": 1.0}}

    said = recommend([row("fsdp", 1, 1.0), row("pp 2 (1f1b) × dp_shard 4", 2, 0.6)], 2 ** 30)
    assert said.startswith("fsdp: it fits"), said
    said = recommend([row("fsdp", 1, 1.3), row("pp 2 (1f1b) × dp_shard 4", 2, 0.6)], 2 ** 30)
    assert said.startswith("pp 2 (1f1b) × dp_shard 4: it fits") and \
        "1200.0 ms for the others' global batch" in said, said


def test_layouts_propose_pipeline_stages_across_machines_when_train_would_take_them():
    from phalanx.plan.layouts import pipeline_candidates

    cfg = config("--n-layer", "8", "--grad-accum", "8")
    assert [v.label for v in pipeline_candidates(cfg, 64, 8)] == [
        "pp 2 (1f1b) × hsdp (4 × 8)", "pp 4 (1f1b) × hsdp (2 × 8)", "pp 8 (1f1b) × dp_shard 8"]
    assert [v.label for v in pipeline_candidates(config("--n-layer", "8", "--grad-accum",
                                                        "2"), 64, 8)] == \
        ["pp 2 (1f1b) × hsdp (4 × 8)"]  # 2 micro-batches leave more stages idle
    assert pipeline_candidates(config("--grad-accum", "8", "--tie-embeddings"), 64, 8) == ()
    assert pipeline_candidates(cfg, 8, 8) == ()  # one machine: none


def test_the_table_keeps_a_pipeline_rows_label_whole_at_80_columns(capsys):
    argv = ["plan", *SHAPE, "--world-size", "4", "--pp", "2", "--dp-shard", "2",
            "--grad-accum", "4"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "pp 2 (1f1b) × dp_shard 2 " in out and "s1: bwd start" in out, out
