"""Where the ranks parted, from their flight-recorder entries (hang.parting): the first
collective, by number within its group, whose op, sizes, dtypes or user line differ."""

from __future__ import annotations

from phalanx.hang.parting import _entry, history, parted


def recorded(seq: int, line: int, op: str = "all_gather", sizes=((4,),), file: str = "",
             group: str = "0") -> dict:
    """One entry as torch's recorder writes it (frames innermost first)."""
    return {"process_group": (group, "default_pg"), "collective_seq_id": seq,
            "profiling_name": f"gloo:{op}", "input_sizes": [list(s) for s in sizes],
            "input_dtypes": ["Float"], "is_p2p": False,
            "frames": [{"name": op, "filename": "/x/torch/distributed/distributed_c10d.py",
                        "line": 3245},
                       {"name": "<module>", "filename": file, "line": line}]}


def test_the_first_number_whose_line_differs_is_where_they_parted(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("\n" * 14 + "if rank == 0:\n    evaluate()\n")
    file = str(script)
    rank0 = history({"entries": [recorded(1, 12, file=file), recorded(2, 12, file=file),
                                 recorded(3, 16, file=file)]})
    rank1 = history({"entries": [recorded(1, 12, file=file), recorded(2, 12, file=file),
                                 recorded(3, 12, file=file)]})
    said = parted({0: rank0, 1: rank1})
    assert said is not None and said.startswith("the ranks parted at collective #3 of group 0: "
                                                "rank(s) 0 ran all_gather [4] at "), said
    assert "train.py:16 in <module>(), under `if rank == 0:` at " in said, said
    assert said.endswith("rank(s) 1 ran all_gather [4] at " + said.split("; rank(s) 1 ran "
                                                                          "all_gather [4] at ")[1])


def test_same_lines_sizes_or_a_single_rank_say_nothing():
    same = [_entry(recorded(n, 12, file="/w/a.py")) for n in (1, 2)]
    assert parted({0: same, 1: same}) is None
    assert parted({0: same}) is None and parted({0: None, 1: None}) is None
    bigger = [_entry(recorded(1, 12, file="/w/a.py", sizes=((8,),)))]
    assert "#1" in (parted({0: same[:1], 1: bigger}) or "")  # sizes differ: parted too


def test_point_to_point_entries_and_a_bad_dump_are_left_out():
    p2p = {**recorded(1, 3, file="/w/a.py"), "is_p2p": True}
    assert history({"entries": [p2p]}) == []
    assert history({"no entries": 1}) is None and history(None) is None
