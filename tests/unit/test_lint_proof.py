"""Issue 47, the sound error tier: PX301 (error) only where lint.proof proves the three
terms — a value known to be the global rank sends rank 0 or 1 away from the call, the call
is a collective over every rank, and the rank sent away runs none in its place — and each
case one step outside the proof is PX303 (a warning) or silent, never an error."""

from __future__ import annotations

import pytest

from phalanx.lint.engine import lint_source
from phalanx.lint.rules import BY_CODE

HEAD = "import os\nimport torch.distributed as dist\n\n"


def tiers(source: str) -> list[str]:
    rules = [BY_CODE["PX301"], BY_CODE["PX303"]]
    return [f.code for f in lint_source("t.py", HEAD + source, rules)]


@pytest.mark.parametrize("proven, unknown", [
    # 1. the rank: torch's, bound once — a parameter's field is not known to be it
    ("rank = dist.get_rank()\nif rank == 0:\n    dist.barrier()\n",
     "rank = args.rank\nif rank == 0:\n    dist.barrier()\n"),
    # rebound: no single value
    ("rank = dist.get_rank()\nif rank == 0:\n    dist.barrier()\n",
     "rank = dist.get_rank()\nrank = 0\nif rank == 0:\n    dist.barrier()\n"),
    # the environment's RANK is the global rank; LOCAL_RANK may be 0 on every rank
    ("if int(os.environ['RANK']) == 0:\n    dist.barrier()\n",
     "if int(os.environ['LOCAL_RANK']) == 0:\n    dist.barrier()\n"),
    # a function's parameter is unknown
    ("def f(x):\n    if dist.get_rank() == 0:\n        dist.all_reduce(x)\n",
     "def f(x, rank):\n    if rank == 0:\n        dist.all_reduce(x)\n"),
    # the test must send rank 0 or rank 1 away: `rank < 2` holds on both
    ("if dist.get_rank() > 0:\n    dist.barrier()\n",
     "if dist.get_rank() < 2:\n    dist.barrier()\n"),
    # `and` with an unknown: rank 1 is still sent away; `or` with an unknown is not
    ("if dist.get_rank() == 0 and step % 10 == 0:\n    dist.barrier()\n",
     "if dist.get_rank() == 0 or (step % 10 == 0 and flag):\n    dist.barrier()\n"),
    # a function of the file without parameters that returns a rank test
    ("def is_main():\n    return dist.get_rank() == 0\nif is_main():\n    dist.barrier()\n",
     "def is_main(r):\n    return r == 0\nif is_main(rank):\n    dist.barrier()\n"),
    # 2. a helper of the file whose collective is on its straight path — not behind a flag
    ("def sync(x):\n    dist.all_reduce(x)\nif dist.get_rank() == 0:\n    sync(t)\n",
     "def sync(x, on=True):\n    if on:\n        dist.all_reduce(x)\n"
     "if dist.get_rank() == 0:\n    sync(t)\n"),
    # ... nor after an early return
    ("def sync(x):\n    dist.all_reduce(x)\n    return x\nif dist.get_rank() == 0:\n"
     "    sync(t)\n",
     "def sync(x):\n    if x is None:\n        return\n    dist.all_reduce(x)\n"
     "if dist.get_rank() == 0:\n    sync(t)\n"),
    # a method is not proven to be the one it names
    ("def save(x):\n    dist.barrier()\nif dist.get_rank() == 0:\n    save(t)\n",
     "class C:\n    def save(self, x):\n        dist.barrier()\n    def run(self, t):\n"
     "        if dist.get_rank() == 0:\n            self.save(t)\n"),
    # 3. the rank sent away runs no collective in its place: print, not a function of
    # the file that could run one
    ("if dist.get_rank() == 0:\n    dist.broadcast(t, 0)\nelse:\n    print(t)\n",
     "def refresh(t):\n    return t\nif dist.get_rank() == 0:\n    dist.broadcast(t, 0)\n"
     "else:\n    refresh(t)\n"),
    # an early exit before the collective
    ("def f(t):\n    if dist.get_rank() != 0:\n        return\n    dist.barrier()\n",
     "def f(t, rank):\n    if rank != 0:\n        return\n    dist.barrier()\n"),
    # libraries: the global main process, not each machine's
    ("from accelerate import Accelerator\naccelerator = Accelerator()\n"
     "if accelerator.is_main_process:\n    accelerator.wait_for_everyone()\n",
     "from accelerate import Accelerator\naccelerator = Accelerator()\n"
     "if accelerator.is_local_main_process:\n    accelerator.wait_for_everyone()\n"),
    # Phalanx's own Run
    ("import phalanx\nrun = phalanx.init()\nif run.is_main:\n    run.barrier()\n",
     "import phalanx\nrun = phalanx.init()\nif cfg.is_main:\n    run.barrier()\n"),
])
def test_the_proof_holds_and_one_step_outside_it_is_no_error(proven, unknown):
    assert tiers(proven) == ["PX301"], proven
    assert "PX301" not in tiers(unknown), unknown


@pytest.mark.parametrize("source", [
    # the same on every rank: RANK's presence (negative literal), not its value
    "ddp = int(os.environ.get('RANK', -1)) != -1\nif ddp:\n    dist.all_reduce(t)\n",
    # a subgroup's collective: its members may be exactly the ranks taking the branch
    "if dist.get_rank() == 0:\n    dist.barrier(group=pair)\n",
    # both arms broadcast
    "if dist.get_rank() == 0:\n    dist.broadcast(t, 0)\nelse:\n    dist.broadcast(u, 0)\n",
    # point-to-point is meant to be one-sided
    "if dist.get_rank() == 0:\n    dist.send(t, 1)\nelse:\n    dist.recv(t, 0)\n",
    # a helper whose collective a constant argument closes
    "def save(x, synchronize=True):\n    if synchronize:\n        dist.barrier()\n"
    "if dist.get_rank() == 0:\n    save(t, synchronize=False)\n",
])
def test_no_error_where_every_rank_joins_or_none_runs(source):
    assert "PX301" not in tiers(source), source


def test_the_world_group_named_is_still_the_world():
    for group in ("None", "dist.group.WORLD"):
        source = f"if dist.get_rank() == 0:\n    dist.all_reduce(t, group={group})\n"
        assert tiers(source) == ["PX301"], source


def test_the_message_names_the_rank_or_the_term_not_proven():
    proven = lint_source("t.py", HEAD + "if dist.get_rank() == 0:\n    dist.barrier()\n",
                         [BY_CODE["PX301"]])
    assert "rank 1 never reaches it and runs no collective in its place" in proven[0].message
    unknown = lint_source("t.py", HEAD + "if args.rank == 0:\n    dist.barrier()\n",
                          [BY_CODE["PX303"]])
    assert "not proven: `args.rank == 0` is not known to send rank 0 or rank 1 the other " \
           "way" in unknown[0].message


FSDP_HEAD = "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n"


@pytest.mark.parametrize("wrap, tier", [
    ("model = FSDP(net)", "PX301"),
    ("model = FSDP(net, sharding_strategy=ShardingStrategy.FULL_SHARD)", "PX301"),
    # a group of its own, or HSDP's per-machine groups: not proven
    ("model = FSDP(net, process_group=pg)", "PX303"),
    ("model = FSDP(net, pg)", "PX303"),
    ("model = FSDP(net, device_mesh=mesh)", "PX303"),
    ("model = FSDP(net, sharding_strategy=ShardingStrategy.HYBRID_SHARD)", "PX303"),
])
def test_an_fsdp_models_state_dict_on_rank_0_is_proven_only_on_the_default_group(wrap, tier):
    source = FSDP_HEAD + f"{wrap}\nif dist.get_rank() == 0:\n    sd = model.state_dict()\n"
    assert tiers(source) == [tier], wrap


def test_a_local_state_dict_is_no_proof():
    source = FSDP_HEAD + ("from torch.distributed.fsdp import StateDictType\n"
                          "model = FSDP(net)\nFSDP.set_state_dict_type(model, "
                          "StateDictType.LOCAL_STATE_DICT)\nif dist.get_rank() == 0:\n"
                          "    sd = model.state_dict()\n")
    assert "PX301" not in tiers(source)


def test_an_fsdp2_forward_on_the_default_mesh_is_proven_and_its_state_dict_is_not():
    head = "from torch.distributed.fsdp import fully_shard\nfully_shard(model)\n"
    assert tiers(head + "if dist.get_rank() == 0:\n    out = model(x)\n") == ["PX301"]
    assert "PX301" not in tiers(head + "if dist.get_rank() == 0:\n    sd = model.state_dict()\n")
    mesh = head.replace("fully_shard(model)", "fully_shard(model, mesh=mesh)")
    assert "PX301" not in tiers(mesh + "if dist.get_rank() == 0:\n    out = model(x)\n")


def test_an_fsdp_model_built_by_a_helper_of_the_file():
    """The guides' FSDP example: `model = create_fsdp_model(model)` returns the name the
    helper wrapped; its full state dict on rank 0 is proven — not when the helper wraps on
    a group of its own, nor when the name is rebound after the call."""
    helper = FSDP_HEAD + ("def wrap(net):\n    model = FSDP(net{extra})\n    return model\n"
                          "def main(net):\n    model = build(net)\n    model = wrap(model)\n"
                          "    if dist.get_rank() == 0:\n        sd = model.state_dict()\n")
    assert tiers(helper.format(extra="")) == ["PX301"]
    assert "PX301" not in tiers(helper.format(extra=", process_group=pg"))
    rebound = helper.format(extra="") + "    model = other\n"
    assert "PX301" not in tiers(rebound)


def test_a_closure_reads_its_enclosing_functions_binding():
    """The nearest enclosing function that binds the name decides it, not the module."""
    source = ("rank = dist.get_rank()\ndef main(args):\n    rank = args.rank\n"
              "    def inner(t):\n        if rank == 0:\n            dist.barrier()\n"
              "    return inner\n")
    assert "PX301" not in tiers(source)
    known = source.replace("rank = args.rank", "rank = dist.get_rank()")
    assert tiers(known) == ["PX301"]


def test_a_conditional_expression_checks_its_other_arm():
    both = "x = dist.barrier() if dist.get_rank() == 0 else dist.barrier()\n"
    assert "PX301" not in tiers(both)
    one = "x = dist.barrier() if dist.get_rank() == 0 else None\n"
    assert tiers(one) == ["PX301"]
