"""The verdict logic of `phalanx verify-resume`: each kind of difference is found and
named with where it first occurs."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn as nn

from phalanx.train.verify import compare, first_difference


def result(losses, weight: float, exp_avg: float):
    model = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(weight)
    opt = torch.optim.AdamW(model.parameters())
    opt.state[model.weight]["exp_avg"] = torch.full((1, 2), exp_avg)
    return SimpleNamespace(losses=losses, model=model, optimizer=opt)


def test_identical_runs_have_no_difference():
    straight = result([3.0, 2.0, 1.0, 0.5], 1.0, 0.1)
    halves = [result([3.0, 2.0], 9.0, 9.0), result([1.0, 0.5], 1.0, 0.1)]
    assert compare(straight, halves, ([1, 2, 3, 4], [1, 2, 3, 4]), per_step=1) == []


def test_each_difference_is_named_where_it_first_occurs():
    straight = result([3.0, 2.0, 1.0, 0.5], 1.0, 0.1)
    halves = [result([3.0, 2.0], 1.0, 0.1), result([1.5, 0.5], 1.0 + 1e-7, 0.2)]
    found = compare(straight, halves, ([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 6, 5]), per_step=2)
    assert found[0] == "data order: training samples differ first at step 3: 5 straight vs 6 resumed"
    assert found[1] == "losses: losses differ first at step 3: 1.0 straight vs 1.5 resumed"
    assert found[2].startswith("weights: `weight` differs (max abs difference 1.19e-07")
    assert found[3].startswith("optimizer state: `param 0 exp_avg` differs")


def test_shapes_and_entries_are_compared():
    assert "shape (2,) vs (3,)" in first_difference({"a": torch.zeros(2)}, {"a": torch.zeros(3)})
    assert "different entries" in first_difference({"a": torch.zeros(2)}, {"b": torch.zeros(2)})


def test_a_planted_scratch_link_is_refused_and_nothing_outside_is_touched(tmp_path, capsys,
                                                                          monkeypatch):
    """`OUT-verify-resume` is verify-resume's own directory: a link planted there (to a
    victim's run directory) is refused before anything is written or removed (issue 39)."""
    import phalanx.launch.ranks as ranks
    from links import SECRET
    from phalanx.cli import main

    victim = tmp_path / "victim"
    (victim / "logs").mkdir(parents=True)
    (victim / "logs" / "rank-0.log").write_text(SECRET)
    (tmp_path / "out-verify-resume").symlink_to(victim)
    (tmp_path / "text.txt").write_text("some text to train on. " * 400)
    monkeypatch.setattr(ranks, "run_ranks", lambda cfg, verb, argv, work, root: 0)
    code = main(["verify-resume", "--data", str(tmp_path / "text.txt"), "--cache-dir",
                 str(tmp_path / "cache"), "--out", str(tmp_path / "out"), "--max-steps", "2"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and "out-verify-resume` is a link" in err[0], err
    assert (victim / "logs" / "rank-0.log").read_text() == SECRET
    assert sorted(p.name for p in victim.rglob("*")) == ["logs", "rank-0.log"]
    assert not (tmp_path / "out").exists()
