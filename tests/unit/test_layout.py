"""The layout flags (config.layout + the registry): what each combination resolves to on
a given world, and what is refused (the one-line texts are in tests/e2e/test_bad_input.py
through the CLI)."""

from __future__ import annotations

import pytest

from phalanx import cli
from phalanx.config.layout import Layout
from phalanx.config.sections import build_config
from phalanx.config.strategy import choose, choose_for_script
from phalanx.errors import UserError

R, S = "dp_replicate", "dp_shard"


@pytest.mark.parametrize("dist, world, name, layout", [
    ({}, 4, "ddp", Layout(dp_replicate=4)),
    ({}, 1, "single", Layout()),
    ({"strategy": "fsdp"}, 4, "fsdp", Layout(dp_shard=4)),  # fsdp ≡ --dp-shard -1
    ({"strategy": "zero"}, 4, "zero", Layout(dp_replicate=4)),
    ({R: 2, S: 2}, 4, "fsdp", Layout(dp_replicate=2, dp_shard=2)),  # HSDP
    ({R: 2}, 4, "fsdp", Layout(dp_replicate=2, dp_shard=2)),  # the shards take the rest
    ({R: 4}, 4, "ddp", Layout(dp_replicate=4)),  # replicas alone: ddp
    ({R: -1}, 4, "ddp", Layout(dp_replicate=4)),
    ({S: -1}, 4, "fsdp", Layout(dp_shard=4)),
    ({S: 2, R: -1}, 8, "fsdp", Layout(dp_replicate=4, dp_shard=2)),
    ({"strategy": "fsdp", R: 2}, 4, "fsdp", Layout(dp_replicate=2, dp_shard=2)),
    ({"strategy": "ddp", R: -1}, 4, "ddp", Layout(dp_replicate=4)),
    ({R: 1, S: 1}, 1, "single", Layout()),
    ({S: 2}, 4, "fsdp", Layout(dp_replicate=2, dp_shard=2)),  # the replicas take the rest
    ({S: 4}, 8, "fsdp", Layout(dp_replicate=2, dp_shard=4)),  # the note's advice
    ({S: -1}, 1, "single", Layout()),  # -1 at one rank: nothing to split
    ({R: 4, S: -1}, 4, "ddp", Layout(dp_replicate=4)),
])
def test_a_layout_resolves_to_one_strategy_and_mesh(dist, world, name, layout):
    choice = choose(build_config({"dist": dist}).dist, world, 1)
    assert (choice.name, choice.layout) == (name, layout)
    assert choice.layout.world == world


@pytest.mark.parametrize("dist, world, needle", [
    ({R: 2}, 3, "2 does not divide 3"),
    ({"strategy": "ddp", R: 2}, 4, "spans 2 ranks, and this job has 4"),
    ({"strategy": "zero", R: -1}, 4, "ZeRO-1 shards only the optimizer state"),
    ({"strategy": "ddp", S: -1}, 4, "`--strategy ddp` with `--dp-shard -1`: DDP replicates"),
    ({"strategy": "fsdp", R: 4}, 4, "shards nothing"),
    ({R: 4, "fsdp_grad_sync": "last"}, 4, "`--fsdp-grad-sync` is an option of `--strategy "
                                          "fsdp`, and this run uses `ddp`"),
    ({R: 2, "bucket_cap_mb": 50.0}, 4, "`--bucket-cap-mb` is an option of `--strategy ddp/zero`, "
                                      "and this run uses `fsdp`"),
])
def test_a_layout_the_world_cannot_take_is_refused_in_one_line(dist, world, needle):
    with pytest.raises(UserError, match=needle.replace("(", r"\(")) as e:
        choose(build_config({"dist": dist}).dist, world, 1)  # (or the config refuses it)
    assert "\n" not in str(e.value)


def test_a_script_gives_the_layout_to_phalanx_init_as_keywords():
    choice = choose_for_script("fsdp", 4, dp_replicate=2, reshard_after_forward=False)
    assert choice.layout == Layout(dp_replicate=2, dp_shard=2)
    assert choice.options.reshard_after_forward is False
    assert choose_for_script(None, 4, dp_shard=4).name == "fsdp"
    with pytest.raises(UserError, match="`--strategy ddp` with `--dp-shard 2`"):
        choose_for_script("ddp", 4, dp_shard=2)


def test_mesh_dimensions_and_their_text():
    hsdp = Layout(dp_replicate=2, dp_shard=4)
    assert hsdp.mesh_dims() == ((R, S), (2, 4)) and hsdp.hybrid
    assert Layout(dp_shard=8).mesh_dims() == (("dp",), (8,))
    assert hsdp.describe() == "dp_replicate 2 × dp_shard 4" and Layout().describe() == "1 rank"


def test_plan_checks_layout_flags_as_train_does(capsys):
    """`phalanx plan` takes the layout flags (an HSDP row, tests/unit/test_plan_hsdp.py),
    refusing in one line what `phalanx train` refuses."""
    for argv, said in ((["--dp-replicate", "3", "--world-size", "4"], "does not divide 4"),
                       (["--tp", "2", "--world-size", "4", "--precision", "bf16"],
                        "models tensor parallelism for MiniGPT in fp32, and `--precision "
                        "bf16` is not fp32"),
                       (["--pp", "2", "--world-size", "4"],
                        "1 micro-batch(es) leave 2 pipeline ranks idle"),
                       (["--pp", "2", "--tp", "2", "--grad-accum", "2", "--world-size", "8"],
                        "`--tp 2` inside the stages is not planned under pipeline stages"),
                       (["--strategy", "ddp", "--dp-shard", "2", "--world-size", "4"],
                        "`--strategy ddp` with `--dp-shard 2`")):
        assert cli.main(["plan", *argv]) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], (argv, err)


def test_a_shard_group_across_machines_is_said_with_the_layout_that_keeps_it_inside():
    note = Layout(dp_shard=8).across_machines(per_machine=4, machines=2)
    assert note is not None and "dp_shard 8 spans machines (4 ranks per machine)" in note
    assert "`--dp-shard 4` (HSDP" in note
    assert Layout(dp_replicate=2, dp_shard=4).across_machines(4, 2) is None  # inside each
    assert Layout(dp_shard=4).across_machines(4, 1) is None  # one machine
    assert "divides 3" in Layout(dp_replicate=3, dp_shard=2).across_machines(3, 2)


def test_a_cluster_jobs_layout_is_checked_when_the_job_is_rendered(capsys, tmp_path,
                                                                  monkeypatch):
    """`phalanx slurm` and `phalanx k8s` pass the layout flags to the job's command, refuse
    in one line a layout the job's ranks cannot take, and say when a group would span its
    machines — at render time, not when the job starts on the cluster."""
    monkeypatch.chdir(tmp_path)
    k8s = ["k8s", "--image", "img:1", "--volume-claim", "runs", "--out", "/phalanx/r"]
    for verb, argv, note in (
            (k8s, ["--nodes", "2", "--nproc-per-node", "2", "--tp", "4"],
             "tp 4 spans machines (2 ranks per machine)"),
            (["slurm"], ["--nodes", "2", "--nproc-per-node", "4", "--dp-shard", "8"],
             "dp_shard 8 spans machines (4 ranks per machine)"),
            (["slurm"], ["--nodes", "2", "--nproc-per-node", "2", "--tp", "2"],
             "dp_shard 2 spans machines (2 ranks per machine): FSDP's all-gathers and "
             "reduce-scatters cross the network every layer; `--dp-replicate 2` (one tp "
             "group a machine, FSDP2's replicas across them) keeps them inside one."),
            (["slurm"], ["--nodes", "2", "--nproc-per-node", "4", "--tp", "2", "--dp-shard",
                         "2"], None)):
        assert cli.main([*verb, *argv]) == 0, argv
        out, err = capsys.readouterr()
        assert " ".join(argv[-2:]) in out.replace('"\n                - "', " ") \
            or f"--{argv[-2][2:]} {argv[-1]}" in out, out  # (k8s: one list item a line)
        assert (note in err) if note else ("spans" not in err), err
    assert cli.main(["slurm", "--nodes", "2", "--nproc-per-node", "2", "--n-head", "6",
                     "--n-embd", "48", "--tp", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "`--tp 3` needs a multiple of 3 ranks, and this job has 4" in err[0]
