"""More rows of tests/e2e/test_bad_input.py's table: the flags, verbs and refusals of
issue 25, and the files they need."""

from __future__ import annotations

from pathlib import Path


def round_three(add) -> None:
    """The flags, verbs and refusals of issue 25 (injection, links, reports, encodings)."""
    for flag, bad, needle in (
            ("--job-name", "demo\ntouch PWNED", "is not a job name this script can carry"),
            ("--job-name", "a b", "is not a job name this script can carry"),
            ("--partition", "gpu\ntouch PWNED", "is not a SLURM partition name"),
            ("--partition", "gpu;rm", "is not a SLURM partition name"),
            ("--time", "01:00:00\ntouch PWNED", "is not a SLURM time"),
            ("--out", "/tmp/r\ntouch PWNED", "holds `\\n`"),
            ("--out", "/tmp/a\\b", "holds `\\\\`"),
            ("--out", "/tmp/packjob1", "holds `packjob`"),
            ("--out", "/tmp/HetJob", "holds `HetJob`"),
            ("--job-name", "my-hetjob", "holds `hetjob`"),
            ("--partition", "packjob", "holds `packjob`")):
        add(f"slurm{flag}={bad!r}", ["slurm", flag, bad], needle)
    for name, argv, needle in (
            ("image-empty", ["--image", ""], "`--image` is empty"),
            ("image-upper", ["--image", "Reg/Phalanx:1"], "is not an image reference"),
            ("image-space", ["--image", "a b"], "is not an image reference"),
            ("pvc-upper", ["--image", "img:1", "--volume-claim", "Runs"],
             "is not a PersistentVolumeClaim name"),
            ("pvc-underscore", ["--image", "img:1", "--volume-claim", "my_runs"],
             "is not a PersistentVolumeClaim name"),
            ("mount-relative", ["--image", "img:1", "--mount-path", "phalanx"],
             "is not a directory a volume can be mounted at"),
            ("mount-root", ["--image", "img:1", "--mount-path", "/"],
             "is not a directory a volume can be mounted at"),
            ("cpu-request", ["--image", "img:1", "--cpu-request", "lots"],
             "is not a Kubernetes quantity"),
            ("memory-request", ["--image", "img:1", "--memory-request", "8GB"],
             "is not a Kubernetes quantity")):
        add(f"k8s-{name}", ["k8s", *argv], needle)
    for name, argv, needle in (
            ("not-utf8", ["{d}/notutf8.py"], "is not UTF-8 text"),
            ("bad-cookie", ["{d}/cookie.py"], "unknown encoding: nope"),
            ("bom-cookie", ["{d}/bomcookie.py"], "starts with a UTF-8 BOM"),
            ("ascii-cookie", ["{d}/asciicookie.py"], "is not ascii text"),
            ("fix-not-utf8", ["--fix", "{d}/notutf8.py"], "is not UTF-8 text")):
        add(f"lint-{name}", ["lint", *argv], needle)
    for name, argv, needle in (
            ("out-dir", ["{run}", "--out", "{w}"], "is a directory; expected a file"),
            ("out-no-parent", ["{run}", "--out", "{w}/nope/r.html"], "does not exist"),
            ("out-proc", ["{run}", "--out", "/proc/x.html"], "cannot write the report page"),
            ("out-under-file", ["{run}", "--out", "{d}/a_file/r.html"], "is not a directory"),
            ("page-is-dir", ["{d}/htmldir"], "report.html` is a directory")):
        add(f"report-{name}", ["report", *argv], needle)
    add("train-link-in-run-dir", ["train", "--out", "{d}/linked"],
        "environment.json` is a link")
    add("train-link-checkpoints", ["train", "--out", "{d}/linkedckpt"],
        "checkpoints` is a link")
    add("export-force-config-link", ["export", "{run}", "--out", "{d}/cfglink/m.safetensors",
                                     "--force"], "config.json` is a link")
    add("train-fault-phase", ["train"], "is malformed",
        {"PHALANX_FAULT": "rank=0,step=1,phase=export2,action=pause"})
    add("train-config-nnodes-float", ["train", "--config", "{d}/nnodes.toml"], "nnodes")
    add("watch-report-dir-proc", ["watch", "--nproc-per-node", "1", "--report-dir", "/proc/x",
                                  "{d}/ok.py"], "`--report-dir` `/proc/x` cannot be created")
    add("run-out-proc", ["run", "--nproc-per-node", "1", "--out", "/proc/x", "{d}/ok.py"],
        "`--out` `/proc/x` cannot be created")
    add("run-max-restarts", ["run", "--max-restarts", "-1", "{d}/ok.py"],
        "`--max-restarts` must be >= 0, got -1")
    for name, spec, needle in (("exits-on-import", "exits_mod:f", "importing `exits_mod` "
                                "called exit"),
                               ("exits-in-factory", "factories:exits", "calling `exits()` "
                                "called exit")):
        add(f"plan-model-{name}", ["plan", "--model", spec], needle, {"PYTHONPATH": "{d}"},
            sub=True)


def round_three_files(d: Path) -> None:
    (d / "notutf8.py").write_bytes(b"x = 1\n\xff\n")
    (d / "cookie.py").write_bytes(b"# coding: nope\nx = 1\n")
    (d / "bomcookie.py").write_bytes(b"\xef\xbb\xbf# coding: latin-1\nx = 1\n")
    (d / "asciicookie.py").write_bytes(b"# coding: ascii\nx = '\xe9'\n")
    (d / "nnodes.toml").write_text("[dist]\nnnodes = 2.5\n")
    (d / "exits_mod.py").write_text("import sys\nsys.exit(5)\n")
    (d / "htmldir").mkdir()
    (d / "htmldir" / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    (d / "htmldir" / "report.html").mkdir()
    for sub, name in (("linked", "environment.json"), ("linkedckpt", "checkpoints"),
                      ("cfglink", "config.json")):
        (d / sub).mkdir()
        (d / sub / name).symlink_to(d / "emptydir")


RUN_SHAPE = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32"]


def data_rows(add) -> None:
    """The data refusals of issue 39: a resume on another corpus, a JSONL line nested too
    deeply, Phalanx's own outputs inside `--data`."""
    add("train-resume-other-corpus", ["train", *RUN_SHAPE, "--out", "{run}", "--data",
                                      "{d}/other.txt"], "was trained on another corpus")
    add("train-data-nested-jsonl", ["train", "--data", "{d}/deep.jsonl"],
        "deep.jsonl` line 2 is nested too deeply")
    add("train-tokenizer-nested", ["train", "--tokenizer", "{d}/deep.json"],
        "`--tokenizer` `{d}/deep.json` is not a JSON file (nested too deeply to read")
    add("train-out-inside-data", ["train", "--data", "{d}/datadir", "--out",
                                  "{d}/datadir/runs/r"], "`--out` `{d}/datadir/runs/r` is "
                                                         "inside `--data`")
    add("verify-resume-out-inside-data", ["verify-resume", "--data", "{d}/datadir", "--out",
                                          "{d}/datadir/runs/r"],
        "`--out` `{d}/datadir/runs/r-verify-resume` is inside `--data`")
    add("train-cache-inside-data", ["train", "--data", "{d}/datadir", "--cache-dir",
                                    "{d}/datadir/cache"], "`--cache-dir` `{d}/datadir/cache` "
                                                          "is inside `--data`")


def data_files(d: Path) -> None:
    from textgen import make_text

    (d / "other.txt").write_text(make_text(2000, seed=4))  # the size of the run's corpus
    (d / "deep.jsonl").write_text('{"text": "a"}\n{"text": "b", "c": ' + "[" * 50_000
                                  + "]" * 50_000 + "}\n")
    (d / "deep.json").write_text("[" * 50_000 + "]" * 50_000)
    (d / "datadir").mkdir()
    (d / "datadir" / "notes.txt").write_text(make_text(3000, seed=5))
