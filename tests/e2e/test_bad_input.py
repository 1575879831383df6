"""Every verb, given bad input: exit code 2, one message (argparse's usage errors: the
message and a pointer to --help), no traceback, and nothing written.

The table is generated from the config's own fields where it can be (every numeric
flag gets NaN, infinities, out-of-range values), so a new flag joins it by being
declared. Most cases run in this process through `phalanx.cli.main` (fast); the few
that would start a process group run as subprocesses.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from bad_input_more import data_files, data_rows, round_three, round_three_files
from phalanx import cli
from phalanx.config.layout import DIMS
from phalanx.config.sections import SECTIONS, flag_of

FLOAT_FIELDS = [f for cls in SECTIONS.values() for f in dataclasses.fields(cls)
                if f.type in ("float", "float | None")]
INT_FIELDS = [f for cls in SECTIONS.values() for f in dataclasses.fields(cls)
              if f.type in ("int", "int | None")]


def _cases() -> list[tuple[str, list[str], str, dict, bool]]:
    """(id, argv, expected text, extra environment, run as a subprocess)."""
    c: list[tuple[str, list[str], str, dict, bool]] = []

    def add(name, argv, needle, env=None, sub=False):
        c.append((name, argv, needle, env or {}, sub))

    for f in FLOAT_FIELDS:  # 11 fields x 3
        for bad in ("nan", "inf", "-inf"):
            add(f"train{flag_of(f)}={bad}", ["train", f"{flag_of(f)}={bad}"],
                f"`{flag_of(f)}` must be a finite number")
    for f in INT_FIELDS:  # 20 fields x 2
        add(f"train{flag_of(f)}=2**64", ["train", flag_of(f), str(2 ** 64)],
            f"`{flag_of(f)}` {2 ** 64} does not fit in 64 bits")
        low = -2 if f.name in DIMS else -1  # a layout dimension's -1 is "the rest"
        add(f"train{flag_of(f)}={low}", ["train", f"{flag_of(f)}={low}"], f"`{flag_of(f)}`")
    for flag in ("--n-layer", "--max-steps", "--seed", "--nproc-per-node"):
        add(f"train{flag}=abc", ["train", flag, "abc"], "invalid int value: 'abc'")
    for flag in ("--out", "--data", "--cache-dir", "--resume"):
        add(f"train{flag}=empty", ["train", flag, ""], f"`{flag}` must not be empty")
    train = [
        ("zero-steps", ["--max-steps", "0"], "`--max-steps` must be a positive number"),
        ("zero-nproc", ["--nproc-per-node", "0"], "`--nproc-per-node` must be a positive"),
        ("zero-micro-batch", ["--micro-batch-size", "0"], "`--micro-batch-size` must be a"),
        ("keep-zero", ["--keep-checkpoints", "0"], "`--keep-checkpoints` must be at least 1"),
        ("zero-lr", ["--lr", "0"], "`--lr` must be a positive number"),
        ("heads", ["--n-embd", "100", "--n-head", "3"], "must be divisible by `--n-head` (3)"),
        ("min-lr", ["--lr", "1e-3", "--min-lr", "1e-2"], "`--min-lr` (0.01) must not exceed"),
        ("hang-vs-timeout", ["--hang-timeout-s", "60", "--timeout-s", "30"], "must be shorter"),
        ("timeout-huge", ["--timeout-s", "1e300"], "`--timeout-s` 1e+300 is more than"),
        ("nproc-huge", ["--nproc-per-node", "100000"], "`--nproc-per-node` 100000 is more"),
        ("val-fraction", ["--val-fraction", "0.6"], "`--val-fraction` must be in (0, 0.5)"),
        ("bpe-vocab", ["--tokenizer", "bpe:100"], "the BPE vocabulary must be a whole number "
         "in 257..65536"),
        ("tokenizer-missing", ["--tokenizer", "nope/tokenizer.json"], "`--tokenizer` "
         "`nope/tokenizer.json` is not a file."),
        ("bin-dtype", ["--bin-dtype", "int8"], "invalid choice: 'int8'"),
        ("text-field-empty", ["--text-field", ""], "`--text-field` must not be empty"),
        ("dropout", ["--dropout", "1.0"], "`--dropout` must be in [0, 1)"),
        ("beta1", ["--beta1", "1.5"], "`--beta1` must be in [0, 1)"),
        ("beta2", ["--beta2", "-0.1"], "`--beta2` must be in [0, 1)"),
        ("precision", ["--precision", "fp8"], "invalid choice: 'fp8'"),
        ("on-nan", ["--on-nan", "ignore"], "invalid choice: 'ignore' (choose from 'skip', "
         "'rollback', 'stop')"),
        ("spike-factor", ["--spike-factor", "0.5"], "`--spike-factor` must be 0 (off) or "
         "above 1, got 0.5."),
        ("straggler-every", ["--straggler-every", "-1"], "`--straggler-every` must be >= 0"),
        ("nan-patience", ["--nan-patience", "0"], "`--nan-patience` must be a positive"),
        ("profile-steps", ["--profile-steps", "7-5"], "`--profile-steps 7-5` must be A-B"),
        ("profile-steps-late", ["--profile-steps", "50-60", "--max-steps", "40"],
         "`--profile-steps 50-60` starts after the run's last step (`--max-steps 40`)"),
        ("init-from-minigpt", ["--init-from", "{d}/emptydir"], "without `--model` needs "
         "MiniGPT in GPT-2's architecture"),
        ("strategy", ["--strategy", "fsdp9"], "invalid choice: 'fsdp9'"),
        ("preset", ["--preset", "huge"], "invalid choice: 'huge'"),
        ("unknown-flag", ["--max-step", "3"], "phalanx train: error: unrecognized arguments: "
         "--max-step 3 See `phalanx train --help`"),
        ("single-many", ["--strategy", "single", "--nproc-per-node", "2"], "unrelated"),
        ("sync-bn", ["--sync-batchnorm", "--nproc-per-node", "2"], "`--sync-batchnorm` needs"),
        ("zero-one-rank", ["--strategy", "zero", "--nproc-per-node", "1"],
         "`--strategy zero` at world size 1 means nothing"),
        ("fsdp-offload-cpu", ["--strategy", "fsdp", "--fsdp-cpu-offload", "--nproc-per-node",
                              "2"], "`--fsdp-cpu-offload` moves parameters"),
        ("fsdp-flag-with-ddp", ["--strategy", "ddp", "--fsdp-grad-sync", "last"],
         "`--fsdp-grad-sync` is an option of `--strategy fsdp`"),
        ("ddp-flag-with-fsdp", ["--strategy", "fsdp", "--bucket-cap-mb", "50"],
         "`--bucket-cap-mb` is an option of `--strategy ddp/zero`"),
        ("fsdp-grad-sync", ["--fsdp-grad-sync", "sometimes"], "invalid choice: 'sometimes'"),
        ("layout-ddp-shards", ["--strategy", "ddp", "--dp-shard", "2"],
         "`--strategy ddp` with `--dp-shard 2`: DDP replicates whole models"),
        ("layout-zero", ["--strategy", "zero", "--dp-replicate", "2"],
         "ZeRO-1 shards only the optimizer state"),
        ("layout-pp", ["--pp", "2"], "`--pp 2`: 1 micro-batch(es) leave 2 pipeline ranks idle"),
        ("pp-tied", ["--pp", "2", "--grad-accum", "2", "--tie-embeddings"],
         "pipeline stages cannot share a weight; train with an untied head (leave out "
         "--tie-embeddings)"),
        ("pp-precision", ["--pp", "2", "--grad-accum", "2", "--precision", "bf16"],
         "`--pp 2`: --precision bf16 (stages train in fp32 in this version) is not built "
         "under pipeline stages yet"),
        ("tp-heads", ["--tp", "2", "--n-head", "3", "--n-embd", "48"],
         "--n-head 3 does not divide into 2 tensor-parallel ranks"),
        ("layout-two-rests", ["--dp-replicate", "-1", "--dp-shard", "-1"],
         "only one dimension can take the rest"),
        ("layout-does-not-divide", ["--dp-replicate", "3", "--nproc-per-node", "2"],
         "3 does not divide 2"),
        ("layout-product", ["--dp-replicate", "2", "--dp-shard", "2", "--nproc-per-node", "2"],
         "4 does not divide 2"),
        ("layout-torchft", ["--fault-tolerance", "torchft", "--dp-replicate", "2"],
         "`--fault-tolerance torchft` with `--dp-replicate 2`: each replica group is one rank"),
        ("layout-fsdp-shards-nothing", ["--strategy", "fsdp", "--dp-replicate", "-1",
                                        "--nproc-per-node", "2"], "shards nothing"),
        ("nnodes-no-endpoint", ["--nnodes", "2"], "`--nnodes 2` needs `--rdzv-endpoint"),
        ("node-rank-too-big", ["--nnodes", "2", "--rdzv-endpoint", "10.0.0.1:29400",
                               "--node-rank", "2"], "`--node-rank` 2 must be in 0 .. 1"),
        ("nnodes-backwards", ["--nnodes", "3:2"], "`--nnodes 3:2` must satisfy"),
        ("nnodes-word", ["--nnodes", "two"], "`--nnodes two` must be N or MIN:MAX"),
        ("endpoint-no-port", ["--nnodes", "2", "--rdzv-endpoint", "node0"],
         "`--rdzv-endpoint node0` must be HOST:PORT"),
        ("endpoint-unresolvable", ["--nnodes", "2", "--rdzv-endpoint", "no-such-host.invalid:1"],
         "cannot resolve `no-such-host.invalid`"),
        ("nccl", ["--backend", "nccl", "--nproc-per-node", "1"], "`--backend nccl` needs CUDA"),
        ("data-missing", ["--data", "{d}/nope.txt"], "`--data` path `{d}/nope.txt` does not"),
        ("data-fifo", ["--data", "{d}/fifo"], "is a FIFO (named pipe), not a text file"),
        ("data-dev-zero", ["--data", "/dev/zero"], "is a character device"),
        ("data-empty-dir", ["--data", "{d}/emptydir"], "contains no files"),
        ("data-empty-file", ["--data", "{d}/empty.txt"], "its files are empty"),
        ("data-binary", ["--data", "{d}/binary.bin"], "binary.bin` is binary (it has NUL"),
        ("data-latin1", ["--data", "{d}/latin1.txt"], "latin1.txt` is not UTF-8 (byte 0xe9"),
        ("block-size", ["--data", "{d}/short.txt", "--block-size", "4096"],
         "`--block-size` 4096 is longer than the corpus allows"),
        ("config-missing", ["--config", "{d}/nope.toml"], "does not exist"),
        ("config-dir", ["--config", "{d}/emptydir"], "is a directory, not a regular file"),
        ("config-fifo", ["--config", "{d}/fifo"], "is a FIFO (named pipe)"),
        ("config-malformed", ["--config", "{d}/broken.toml"], "is not valid TOML"),
        ("config-unknown-key", ["--config", "{d}/unknown.toml"], "unknown key `max_step`"),
        ("config-unknown-section", ["--config", "{d}/section.toml"],
         "unknown section `[trian]` in `{d}/section.toml`; did you mean `[train]`? expected "
         "one of: [model], [data], [train], [dist]."),
        ("config-top-level-key", ["--config", "{d}/toplevel.toml"], "`max_steps` in "
         "`{d}/toplevel.toml` is outside any table; it belongs under `[train]`"),
        ("config-wrong-type", ["--config", "{d}/type.toml"], "must be int"),
        ("config-bad-choice", ["--config", "{d}/choice.toml"], "expected one of"),
        ("config-nan", ["--config", "{d}/nan.toml"], "must be a finite number"),
        ("out-under-file", ["--out", "{d}/a_file/run"], "is not a writable directory"),
        ("out-in-proc", ["--out", "/proc/phalanx-run"], "is not a writable directory"),
        ("resume-missing", ["--resume", "{d}/nope"], "`--resume` path `{d}/nope` does not"),
        ("resume-junk", ["--resume", "{d}/junk"], "holds no valid checkpoint"),
    ]
    for name, argv, needle in train:
        add(f"train-{name}", ["train", *argv], needle)
    add("train-fault-garbage", ["train"], "PHALANX_FAULT=`garbage` is malformed",
        {"PHALANX_FAULT": "garbage"})
    add("train-fault-rank", ["train"], "is malformed", {"PHALANX_FAULT": "rank=x,step=1"})
    add("train-fault-action", ["train"], "is malformed",
        {"PHALANX_FAULT": "rank=0,step=1,action=explode"})
    add("run-fault-garbage", ["run", "--nproc-per-node", "2", "{d}/ok.py"],
        "PHALANX_FAULT=`garbage` is malformed", {"PHALANX_FAULT": "garbage"})
    add("train-bad-env-rank", ["train"], "launcher environment",
        {"RANK": "x", "WORLD_SIZE": "2"}, sub=True)
    for verb in ("verify-resume", "bench"):
        add(f"{verb}-lr-nan", [verb, "--lr", "nan"], "`--lr` must be a finite number")
        add(f"{verb}-heads", [verb, "--n-head", "3"], "must be divisible")
        add(f"{verb}-data-fifo", [verb, "--data", "{d}/fifo"], "is a FIFO")
    add("verify-resume-one-step", ["verify-resume", "--max-steps", "1"], "at least 2")
    for name, argv, needle in (
            ("time", ["--time", "1h"], "`--time 1h` is not a SLURM time"),
            ("nodes", ["--nodes", "0"], "must be between 1"),
            ("heads", ["--n-head", "3"], "must be divisible"),
            ("signal", ["--signal-s", "5"], "must be between 10"),
            ("script-dir", ["--script", "{d}/emptydir"], "cannot write `{d}/emptydir`")):
        add(f"slurm-{name}", ["slurm", *argv], needle)
    for name, argv, needle in (
            ("name", ["--image", "x", "--name", "Bad_Name"], "is not a Kubernetes name"),
            ("no-image", [], "the following arguments are required: --image"),
            ("out-off-volume", ["--image", "x", "--volume-claim", "runs", "--out", "/tmp/r"],
             "`--out /tmp/r` is not under `--mount-path /phalanx`"),
            ("nodes", ["--image", "x", "--nodes", "0"], "must be between 1")):
        add(f"k8s-{name}", ["k8s", *argv], needle)
    for flag, bad in (("--repeats", "0"), ("--steps", "0"), ("--warmup", "-1"),
                      ("--repeats", "abc"), ("--steps", "100000")):
        add(f"bench{flag}={bad}", ["bench", flag, bad], f"argument {flag}:")
    export = [
        ("source-missing", ["{d}/nope", "--out", "{w}/m.safetensors"], "does not exist"),
        ("source-junk", ["{d}/junk", "--out", "{w}/m.safetensors"], "holds no valid checkpoint"),
        ("out-suffix", ["{run}", "--out", "{w}/m.bin"], "should name a .safetensors file"),
        ("out-exists", ["{run}", "--out", "{d}/exists/m.safetensors"], "already exists"),
        ("config-exists", ["{run}", "--out", "{d}/withconfig/m.safetensors"], "already exists"),
        ("out-proc", ["{run}", "--out", "/proc/x.safetensors"], "cannot write"),
        ("out-fifo", ["{run}", "--out", "{d}/fifo"], "should name a .safetensors file"),
        ("crafted-config", ["{crafted}", "--out", "{w}/m.safetensors"], "invalid `train` section"),
        ("no-out", ["{run}"], "the following arguments are required: --out"),
        ("gpt2-shape", ["{run}", "--format", "gpt2", "--out", "{w}/hf"],
         "`phalanx export --format gpt2` needs MiniGPT in GPT-2's architecture"),
    ]
    for name, argv, needle in export:
        add(f"export-{name}", ["export", *argv], needle)
    lint = [
        ("fifo", ["{d}/fifo"], "is a FIFO (named pipe), not a regular file"),
        ("dev-zero", ["/dev/zero"], "is a character device"),
        ("missing", ["{d}/nope.py"], "does not exist"),
        ("syntax", ["{d}/syntax.py"], "not valid Python"),
        ("binary", ["{d}/binary.bin"], "cannot read"),
        ("select", ["--select", "ZZ999", "{d}/ok.py"], "`--select` ZZ999 matches no rule"),
        ("ignore", ["--ignore", "QQ1", "{d}/ok.py"], "`--ignore` QQ1 matches no rule"),
        ("explain", ["--explain", "PX000"], "no rule `PX000`"),
        ("nothing", [], "give at least one file or directory"),
        ("format", ["--format", "xml", "{d}/ok.py"], "invalid choice: 'xml'"),
    ]
    for name, argv, needle in lint:
        add(f"lint-{name}", ["lint", *argv], needle)
    for verb, extra in (("doctor", []), ("watch", ["{d}/ok.py"]), ("run", ["{d}/ok.py"])):
        for bad, needle in (("0", "must be a positive number, got 0"),
                            ("-1", "must be a positive number, got -1"),
                            ("abc", "argument --nproc-per-node: invalid int value"),
                            ("100000", "100000 is more than 4096")):
            add(f"{verb}-nproc={bad}", [verb, "--nproc-per-node", bad, *extra], needle)
        add(f"{verb}-node-rank", [verb, "--nnodes", "2", "--node-rank", "2",
                                  "--rdzv-endpoint", "127.0.0.1:29400", *extra],
            "`--node-rank` 2 must be in 0 .. 1")
        add(f"{verb}-no-endpoint", [verb, "--nnodes", "2", *extra],
            "needs `--rdzv-endpoint HOST:PORT`")
        flag = "--init-timeout-s" if verb == "doctor" else "--hang-timeout-s"
        for bad in ("nan", "inf", "-5", "1e12", "abc") + (("0",) if verb != "run" else ()):
            add(f"{verb}{flag}={bad}", [verb, flag, bad, *extra], f"argument {flag}:")
    for name, spec, needle in (("nocolon", "pkg", "expected `package.module:factory`"),
                               ("nomodule", "nope_mod:f", "cannot load it"),
                               ("raises", "factories:raises", "the factory raised ValueError"),
                               ("returns-int", "factories:returns_int", "returned int")):
        add(f"doctor-model-{name}", ["doctor", "--nproc-per-node", "1", "--model", spec],
            needle, {"PYTHONPATH": "{d}"}, sub=True)
    for name, spec, needle in (("nomodule", "nope_mod:f", "cannot load it"),
                               ("returns-int", "factories:returns_int", "returned int"),
                               ("no-example", "factories:no_example", "its forward on the meta device raised")):
        add(f"plan-model-{name}", ["plan", "--model", spec], needle, {"PYTHONPATH": "{d}"},
            sub=True)
    add("plan-gpu", ["plan", "--gpu", "tpu9"], "unknown `--gpu tpu9`; known: h100, h200, "
        "a100-80g, a100-40g, l4")
    add("plan-world-0", ["plan", "--world-size", "0"], "argument --world-size: must be "
        "between 1")
    add("plan-mfu", ["plan", "--mfu", "0"], "`--mfu 0.0` must be in (0, 1]")
    add("plan-busbw-from", ["plan", "--busbw-from", "{d}/nope.json"], "`--busbw-from "
        "{d}/nope.json`: not the JSON of `phalanx doctor --json`")
    add("plan-model-states-measure", ["plan", "--model-states", "--measure"],
        "`--model-states` prints the model states' arithmetic only")
    add("plan-simulate-model", ["plan", "--model", "factories:with_example", "--simulate"],
        "`--simulate` runs MiniGPT's training steps only", {"PYTHONPATH": "{d}"}, sub=True)
    add("plan-simulate-rank", ["plan", "--world-size", "4", "--simulate",
                               "--simulate-rank", "9"], "rank 9")
    add("plan-simulate-world", ["plan", "--world-size", "1048576", "--simulate"],
        "`--simulate` at 1,048,576 ranks: it simulates at most 65,536")  # (issue 39: hours)
    add("plan-measure-model", ["plan", "--model", "factories:with_example", "--measure"],
        "`--measure` trains your model as `phalanx train` does", {"PYTHONPATH": "{d}"}, sub=True)
    for name, script, needle in (("missing", "{d}/nope.py", "does not exist"),
                                 ("dir", "{d}/emptydir", "is a directory"),
                                 ("fifo", "{d}/fifo", "is a FIFO"),
                                 ("syntax", "{d}/syntax.py", "line 2: invalid syntax")):
        add(f"watch-script-{name}", ["watch", "--nproc-per-node", "2", script], needle)
        add(f"run-script-{name}", ["run", "--nproc-per-node", "2", script], needle)
    add("report-missing", ["report", "{d}/nope"], "`{d}/nope` is not a directory")
    add("report-empty", ["report", "{d}/emptydir"], "holds no run: no metrics.jsonl")
    add("report-file", ["report", "{d}/ok.py"], "is not a directory")
    round_three(add)
    data_rows(add)
    add("no-verb", [], "the following arguments are required: VERB")
    add("bad-verb", ["trian"], "invalid choice: 'trian'")
    return c


CASES = _cases()


@pytest.fixture(scope="module")
def files(tmp_path_factory, small_corpus_file, cache_dir):
    d = tmp_path_factory.mktemp("bad")
    (d / "empty.txt").write_text("")
    (d / "binary.bin").write_bytes(bytes(range(256)) * 64)
    (d / "latin1.txt").write_bytes("déjà vu, naïve café\n".encode("latin-1") * 40)
    (d / "short.txt").write_text("print('hello')\n" * 20)
    (d / "broken.toml").write_text("[model\nn_layer = 2\n")
    (d / "unknown.toml").write_text("[train]\nmax_step = 3\n")
    (d / "section.toml").write_text("[trian]\nmax_steps = 3\n")
    (d / "toplevel.toml").write_text("max_steps = 3\n")
    (d / "type.toml").write_text("[train]\nmax_steps = 'x'\n")
    (d / "choice.toml").write_text("[train]\nprecision = 'fp8'\n")
    (d / "nan.toml").write_text("[train]\nlr = nan\n")
    (d / "a_file").write_text("x")
    (d / "ok.py").write_text("print('ok')\n")
    (d / "syntax.py").write_text("import os\ndef f(:\n    pass\n")
    (d / "factories.py").write_text("def raises():\n    raise ValueError('no weights')\n\n"
                                    "def returns_int():\n    return 3\n\n"
                                    "def no_example():\n    import torch\n"
                                    "    return torch.nn.Linear(2, 2)\n\n"
                                    "def with_example():\n    import torch\n"
                                    "    return torch.nn.Linear(2, 2), torch.ones(1, 2)\n\n"
                                    "def exits():\n    import sys\n    sys.exit(3)\n")
    (d / "emptydir").mkdir()
    (d / "junk").mkdir()
    (d / "junk" / "notes.txt").write_text("hello")
    os.mkfifo(d / "fifo")
    round_three_files(d)
    data_files(d)
    for sub, names in (("exists", ["m.safetensors"]), ("withconfig", ["config.json"])):
        (d / sub).mkdir()
        for n in names:
            (d / sub / n).write_text("{}")
    run = d / "run"
    proc = subprocess.run([sys.executable, "-m", "phalanx", "train", "--n-layer", "1",
                           "--n-head", "2", "--n-embd", "32", "--block-size", "32",
                           "--micro-batch-size", "2", "--max-steps", "2", "--eval-batches", "1",
                           "--sample-tokens", "0", "--nproc-per-node", "1", "--data",
                           str(small_corpus_file), "--cache-dir", str(cache_dir), "--out",
                           str(run)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    crafted = d / "crafted"
    crafted.mkdir()
    _craft_config_key(run / "checkpoints" / "step-00000002", crafted / "step-00000002")
    return d


def _craft_config_key(src: Path, dst: Path) -> None:
    """A copy of a checkpoint whose sidecar's config gained a key, manifest re-hashed."""
    import json
    import shutil

    from phalanx.checkpoint.digest import entry, file_digest
    from phalanx.checkpoint.store import MANIFEST

    shutil.copytree(src, dst)
    state = json.loads((dst / "train_state.json").read_text())
    state["meta"]["config"]["train"]["__class__"] = "os.system"
    (dst / "train_state.json").write_text(json.dumps(state))
    manifest = json.loads((dst / MANIFEST).read_text())
    manifest["files"]["train_state.json"] = entry((dst / "train_state.json").stat().st_size,
                                                  file_digest(dst / "train_state.json"))
    (dst / MANIFEST).write_text(json.dumps(manifest))


def _snapshot(*roots: Path) -> dict[str, tuple]:
    out = {}
    for root in roots:
        for p in root.rglob("*"):
            st = p.lstat()
            out[str(p)] = (st.st_size, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else ()
    return out


def _fill(arg: str, files: Path, work: Path) -> str:
    return arg.format(d=files, w=work, run=files / "run", crafted=files / "crafted")


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_nothing_written(case, files, tmp_path, monkeypatch,
                                                      capfd, corpus_file, cache_dir):
    name, argv, needle, env, sub = case
    work = tmp_path / "work"
    work.mkdir()
    argv = [_fill(a, files, work) for a in argv]
    if argv and argv[0] in ("train", "verify-resume", "bench"):  # the case's flags win
        argv[1:1] = ["--out", str(work / "run"), "--cache-dir", str(cache_dir),
                     "--data", str(corpus_file)]
    monkeypatch.chdir(work)
    before = _snapshot(work, files)
    if sub:
        proc = subprocess.run([sys.executable, "-m", "phalanx", *argv], capture_output=True,
                              text=True, timeout=120, cwd=work,
                              env={**os.environ, **{k: _fill(v, files, work)
                                                    for k, v in env.items()}})
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    else:
        for key, value in env.items():
            monkeypatch.setenv(key, _fill(value, files, work))
        try:
            code = cli.main(argv)
        except SystemExit as exc:  # argparse
            code = exc.code
        out, err = capfd.readouterr()
    assert code == 2, (code, out, err)
    assert "Traceback" not in out + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and (len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("See `"))), lines
    message = lines[-1] if "usage:" in lines[0] else lines[0]
    assert _fill(needle, files, work) in " ".join(lines), message
    assert _snapshot(work, files) == before, "something was written"


def test_the_table_covers_every_verb_with_enough_cases():
    verbs = {argv[0] for _, argv, _, _, _ in CASES if argv}
    assert set(cli.VERBS) <= verbs, set(cli.VERBS) - verbs
    assert len(CASES) >= 250, len(CASES)
