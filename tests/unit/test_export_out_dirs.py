"""A failed `phalanx export` leaves no empty `--out` directories behind (issue 25): the
directories of `--out` are made only when the weights are written, and those it made are
removed again when that write fails."""

from __future__ import annotations

import sys

import pytest

from phalanx.cli import main


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_no_checkpoint_creates_no_out_directories(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    out = tmp_path / "new" / "a" / "b" / "model.safetensors"
    assert main(["export", str(run), "--out", str(out)]) == 2
    assert "holds no valid checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "new").exists(), _tree(tmp_path)


def test_an_unreadable_checkpoint_creates_no_out_directories(tmp_path, capsys):
    step = tmp_path / "run" / "checkpoints" / "step-00000004"
    step.mkdir(parents=True)
    (step / "manifest.json").write_text("{not json")
    out = tmp_path / "new" / "a" / "model.safetensors"
    assert main(["export", str(step), "--out", str(out)]) == 2
    assert "cannot be used" in capsys.readouterr().err
    assert not (tmp_path / "new").exists(), _tree(tmp_path)


@pytest.fixture
def a_checkpoint(monkeypatch, tmp_path):
    """`export` finds a valid (stand-in) checkpoint of a tiny model."""
    import phalanx.checkpoint.resume as resume
    import phalanx.checkpoint.store as store
    import phalanx.cli.export as command
    from phalanx.config.sections import Config

    cfg = Config()
    cfg.model.n_layer, cfg.model.n_head, cfg.model.n_embd, cfg.model.block_size = 1, 2, 16, 8
    checkpoint = tmp_path / "run" / "checkpoints" / "step-00000004"
    checkpoint.mkdir(parents=True)
    monkeypatch.setattr(resume, "find_checkpoint", lambda source, warn: checkpoint)
    monkeypatch.setattr(command, "_saved_meta", lambda checkpoint: dict(meta))
    monkeypatch.setattr(command, "_saved_config", lambda checkpoint, meta: (4, cfg))
    monkeypatch.setattr(store, "load_checkpoint", lambda *args: None)
    meta: dict = {}
    return meta  # the checkpoint's meta (a test may add to it)


def test_a_failed_write_removes_the_directories_it_made(tmp_path, capsys, monkeypatch,
                                                        a_checkpoint):
    import phalanx.checkpoint.export as export

    def full_disk(model, out_dir, *args):
        assert out_dir.is_dir()  # made for the write
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export, "export_weights", full_disk)
    (tmp_path / "kept").mkdir()
    out = tmp_path / "kept" / "new" / "a" / "model.safetensors"
    assert main(["export", "run", "--out", str(out)]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert not (tmp_path / "kept" / "new").exists() and (tmp_path / "kept").is_dir()


def test_a_successful_export_makes_its_directories(tmp_path, capsys, a_checkpoint):
    out = tmp_path / "new" / "a" / "model.safetensors"
    assert main(["export", "run", "--out", str(out)]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in out.parent.iterdir()) == ["config.json", "model.safetensors"]


def test_a_file_in_the_way_is_refused_before_the_checkpoint_is_read(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "a" / "model.safetensors"
    assert main(["export", str(tmp_path / "nope"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"cannot create `{out.parent}` for `--out`: `{tmp_path / 'file'}` is a regular " \
           f"file, not a directory" in err, err


# -- issue 39: a checkpoint names code; export runs it only when the user names it too --
PLANTED = ("import pathlib\npathlib.Path('imported').write_text('ran')\n"
           "def make(vocab_size=256):\n    pathlib.Path('called').write_text('ran')\n")


@pytest.fixture
def a_factory_checkpoint(monkeypatch, tmp_path):
    """A checkpoint whose `train_state.json` names `planted_mod:make`, a module in the
    current directory that leaves a file behind when imported or called."""
    import phalanx.checkpoint.resume as resume
    import phalanx.checkpoint.store as store
    import phalanx.cli.export as command
    from phalanx.config.sections import build_config

    (tmp_path / "planted_mod.py").write_text(PLANTED)
    monkeypatch.chdir(tmp_path)
    cfg = build_config({"model": {"factory": "planted_mod:make", "block_size": 8}})
    monkeypatch.setattr(resume, "find_checkpoint", lambda source, warn: tmp_path)
    monkeypatch.setattr(command, "_saved_meta", lambda checkpoint: {"config": cfg.to_dict()})
    monkeypatch.setattr(store, "load_checkpoint", lambda *args: None)
    monkeypatch.delitem(sys.modules, "planted_mod", raising=False)
    return tmp_path


@pytest.mark.parametrize("given", [[], ["--model", "planted_mod:other"]])
def test_export_runs_no_code_a_checkpoint_names(a_factory_checkpoint, capsys, given):
    out = a_factory_checkpoint / "new" / "model.safetensors"
    code = main(["export", "run", "--out", str(out), *given])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1, err
    assert "`--model planted_mod:make`" in err[0] and "names" in err[0], err
    left = sorted(p.name for p in a_factory_checkpoint.iterdir())
    assert left == ["planted_mod.py"], left  # not imported, not called, nothing written
    assert "planted_mod" not in sys.modules


def test_export_runs_the_factory_the_user_names(a_factory_checkpoint, capsys):
    out = a_factory_checkpoint / "new" / "model.safetensors"
    main(["export", "run", "--out", str(out), "--model", "planted_mod:make"])
    assert (a_factory_checkpoint / "called").read_text() == "ran"  # the user's choice


# -- issue 39: the run's tokenizer.json is copied beside the weights only when it is one --
def _a_tokenizer(path):
    from phalanx.data.tokenizer import train_bpe

    train_bpe(["the quick brown fox jumps over the lazy dog " * 20], 260).tok.save(str(path))
    return path


def test_a_tokenizer_link_is_refused_and_nothing_outside_is_read(tmp_path, capsys,
                                                                  a_checkpoint):
    from links import SECRET

    secret = tmp_path / "key"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    (tmp_path / "run" / "tokenizer.json").symlink_to(secret)
    out = tmp_path / "new" / "model.safetensors"
    assert main(["export", "run", "--out", str(out)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "tokenizer.json` is a link (→" in err[0], err
    assert not (tmp_path / "new").exists(), _tree(tmp_path)  # nothing copied, no weights
    assert secret.read_text() == SECRET and secret.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("text, needle", [
    ('{"not": "a tokenizer"}', "is not a tokenizer"),
    ("-----BEGIN PRIVATE KEY-----\n", "is not a tokenizer"),
    (None, "is not the tokenizer"),  # a real tokenizer, not the one the run recorded
])
def test_a_tokenizer_json_that_is_not_the_runs_tokenizer_is_refused(
        tmp_path, capsys, a_checkpoint, text, needle):
    planted = tmp_path / "run" / "tokenizer.json"
    if text is None:
        _a_tokenizer(planted)
        a_checkpoint["tokenizer"] = {"kind": "file", "vocab_size": 260, "digest": "0" * 16}
    else:
        planted.write_text(text)
    out = tmp_path / "new" / "model.safetensors"
    assert main(["export", "run", "--out", str(out)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "new").exists(), _tree(tmp_path)


def test_the_runs_tokenizer_is_copied_beside_the_weights(tmp_path, capsys, a_checkpoint):
    from phalanx.data.cache import file_digest

    made = _a_tokenizer(tmp_path / "run" / "tokenizer.json")
    a_checkpoint["tokenizer"] = {"kind": "file", "vocab_size": 260,
                                 "digest": file_digest(made)}
    out = tmp_path / "new" / "model.safetensors"
    assert main(["export", "run", "--out", str(out)]) == 0, capsys.readouterr().err
    assert (out.parent / "tokenizer.json").read_bytes() == made.read_bytes()
