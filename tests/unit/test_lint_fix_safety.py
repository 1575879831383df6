"""`phalanx lint --fix` never makes a file worse: offsets counted as Python counts lines,
every byte outside a fix kept (newlines, encoding, BOM), atomic writes, a file edited
meanwhile left alone, all fixes decided before any is written, and a fix that would not
parse never written. Each test is a case an adversarial probe found."""

from __future__ import annotations

import errno
import os
import pathlib
import stat

import pytest

from phalanx.cli import main
from phalanx.lint import fix as fixmod


def lint(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["lint", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


# PX603: the deprecated spelling, rewritten to the one torch documents as equivalent
LOADS = b"x = torch.cuda.amp.GradScaler(f)\ny = torch.cuda.amp.GradScaler(g)\n"
FIXED = b'x = torch.amp.GradScaler("cuda", f)\ny = torch.amp.GradScaler("cuda", g)\n'
OLD, NEW = b"torch.cuda.amp.GradScaler(", b'torch.amp.GradScaler("cuda", '


@pytest.mark.parametrize("odd", ["\x0c", "\x1c", "\x1e", "\x85", "\u2028", "\u2029"],
                         ids=["formfeed", "fs", "rs", "nel", "ls", "ps"])
@pytest.mark.parametrize("where", ["comment", "string"])
def test_fix_counts_lines_as_python_does(tmp_path, capsys, odd, where):
    """str.splitlines splits on these; Python's tokenizer does not: the fix lands on the
    call ast found, not one line off."""
    head = (f"# section{odd} break\n" if where == "comment" else f"s = 'a{odd}b'\n")
    path = tmp_path / "ff.py"
    path.write_bytes(b"import torch\n" + head.encode() + LOADS)
    code, _, err = lint(capsys, "--fix", path)
    assert path.read_bytes() == b"import torch\n" + head.encode() + FIXED, err
    assert code == 0 and "fixed 2 finding(s) in 1 file(s)" in err


@pytest.mark.parametrize("newline", [b"\r\n", b"\r", b"mixed"])
def test_fix_and_diff_keep_the_newline_style(tmp_path, capsys, newline):
    ends = [b"\r\n", b"\n", b"\r", b"\r\n"] if newline == b"mixed" else [newline] * 4
    lines = [b"import torch", b"x = torch.cuda.amp.GradScaler(f)", b"z = 1  # \x0c",
             b"y = torch.cuda.amp.GradScaler(g)"]
    before = b"".join(a + b for a, b in zip(lines, ends))
    after = before.replace(OLD, NEW)
    path = tmp_path / "nl.py"
    path.write_bytes(before)
    code, out, _ = lint(capsys, "--diff", path)
    assert code == 1 and path.read_bytes() == before
    assert '+x = torch.amp.GradScaler("cuda", f)' + ends[1].decode() in out
    lint(capsys, "--fix", path)
    assert path.read_bytes() == after


def test_diff_marks_a_last_line_without_newline(tmp_path, capsys):
    path = tmp_path / "end.py"
    path.write_bytes(b"import torch\nx = torch.cuda.amp.GradScaler(f)")
    _, out, _ = lint(capsys, "--diff", path)
    assert out.endswith('+x = torch.amp.GradScaler("cuda", f)\n'
                        "\\ No newline at end of file\n")


@pytest.mark.parametrize("head, encoding", [
    (b"# -*- coding: latin-1 -*-\n", "latin-1"),
    (b"\xef\xbb\xbf", "utf-8"),
    (b"\xef\xbb\xbf# coding: utf-8\n", "utf-8"),
], ids=["latin1-cookie", "bom", "bom-and-cookie"])
def test_encoding_cookie_and_bom_are_read_and_kept(tmp_path, capsys, head, encoding):
    body = "import torch\nx = torch.cuda.amp.GradScaler('café')  # é\n".encode(encoding)
    path = tmp_path / "enc.py"
    path.write_bytes(head + body)
    code, out, err = lint(capsys, path)
    assert code == 0 and "PX603" in out and "not valid Python" not in err
    code, _, err = lint(capsys, "--fix", path)
    assert code == 0, err
    assert path.read_bytes() == head + body.replace(OLD, NEW)


def test_full_disk_leaves_the_file_byte_identical(tmp_path, capsys, monkeypatch):
    path = tmp_path / "full.py"
    before = b"import torch\r\n" + LOADS
    path.write_bytes(before)

    def full(*_):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def full_write_text(self, *args, **kwargs):  # opened for writing (truncated), then full
        open(self, "wb").close()
        full()

    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: full() if fd > 2 else real_write(fd, data))
    monkeypatch.setattr(pathlib.Path, "write_text", full_write_text)
    monkeypatch.setattr(pathlib.Path, "write_bytes", full_write_text)
    code, out, err = lint(capsys, "--fix", path)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "No space left on device" in err and str(path) in err
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["full.py"]  # no temporary file left behind


def test_fix_keeps_mode_and_links(tmp_path, capsys):
    real = tmp_path / "real.py"
    real.write_bytes(b"import torch\n" + LOADS)
    real.chmod(0o751)
    link = tmp_path / "link.py"
    link.symlink_to(real.name)
    lint(capsys, "--fix", link)
    assert link.is_symlink() and real.read_bytes() == b"import torch\n" + FIXED
    assert stat.S_IMODE(real.stat().st_mode) == 0o751
    assert sorted(os.listdir(tmp_path)) == ["link.py", "real.py"]


def test_an_edit_saved_during_the_run_is_kept(tmp_path, capsys, monkeypatch):
    path = tmp_path / "edited.py"
    path.write_bytes(b"import torch\n" + LOADS)
    mine = b"import torch\nx = torch.amp.GradScaler('cuda', f)  # my edit\n"
    fixer = fixmod.FIXERS["PX603"]

    def saved_meanwhile(*args):
        path.write_bytes(mine)  # the user's editor saves while phalanx is fixing
        return fixer(*args)

    monkeypatch.setitem(fixmod.FIXERS, "PX603", saved_meanwhile)
    code, _, err = lint(capsys, "--fix", path)
    assert path.read_bytes() == mine
    assert code == 1 and "changed while it was being fixed" in err
    assert "fixed 0 finding(s) in 0 file(s)" in err


def test_named_files_are_all_or_nothing(tmp_path, capsys):
    good, bad = tmp_path / "a.py", tmp_path / "b.py"
    good.write_bytes(b"import torch\n" + LOADS)
    bad.write_bytes(b"def f(:\n")
    code, _, err = lint(capsys, "--fix", good, bad)
    assert code == 2 and "not valid Python" in err
    assert good.read_bytes() == b"import torch\n" + LOADS  # stopped: nothing written


def test_in_a_directory_unreadable_and_invalid_files_are_skipped_alike(tmp_path, capsys):
    (tmp_path / "a.py").write_bytes(b"import torch\n" + LOADS)
    (tmp_path / "b.py").write_bytes(bytes(range(256)))  # not UTF-8: cannot be read
    (tmp_path / "c.py").write_bytes(b"def f(:\n")  # not Python
    code, out, err = lint(capsys, "--fix", tmp_path)
    assert code == 0 and "fixed 2 finding(s) in 1 file(s)" in err
    assert (tmp_path / "a.py").read_bytes() == b"import torch\n" + FIXED
    assert f"skipped `{tmp_path / 'b.py'}`: cannot read it" in err
    assert f"skipped `{tmp_path / 'c.py'}` line 1: not valid Python" in err
    assert "(2 skipped" in out


def _broken_in_b(source, ctx, node, where, real=fixmod.FIXERS["PX603"]):
    if not ctx.path.endswith("b.py"):
        return real(source, ctx, node, where)
    return [fixmod.Edit(where.start(node), where.start(node), "(")]


def test_a_fix_that_does_not_parse_writes_no_file(tmp_path, capsys, monkeypatch):
    """All fixes are decided and re-parsed before any file is replaced: a Phalanx bug in
    b.py leaves a.py (fixable, found first) unchanged too."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_bytes(b"import torch\nscaler = torch.cuda.amp.GradScaler()\n")
    b.write_bytes(b"import torch\n" + LOADS)
    monkeypatch.setitem(fixmod.FIXERS, "PX603", _broken_in_b)
    code, out, err = lint(capsys, "--fix", tmp_path)
    assert code == 3 and out == "" and err.count("\n") == 1
    assert "bug" in err and "PX603" in err and f"`{b}`" in err
    assert a.read_bytes() == b"import torch\nscaler = torch.cuda.amp.GradScaler()\n"
    assert b.read_bytes() == b"import torch\n" + LOADS


def test_a_file_that_would_not_round_trip_is_left_unfixed(tmp_path, capsys):
    """cp932 reads two byte pairs as `≒`; writing it back would change the user's bytes."""
    path = tmp_path / "jp.py"
    before = (b"# -*- coding: cp932 -*-\nimport torch  # \x87\x90\n"
              b"x = torch.cuda.amp.GradScaler(f)\n")
    path.write_bytes(before)
    code, out, err = lint(capsys, "--fix", path)
    assert path.read_bytes() == before and code == 0
    assert f"`{path}` is left unfixed" in err and "PX603" in out
