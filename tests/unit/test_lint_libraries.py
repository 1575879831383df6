"""Issue 47: the collectives of the libraries users train with. A new user's script with
Accelerate's `reduce`, `gather` and `wait_for_everyone` under `if
accelerator.is_main_process:` got one finding of three (`wait_for_everyone` was unknown),
and Fabric's `fabric.barrier()` under `if fabric.is_global_zero:` none."""

from __future__ import annotations

import pytest

from phalanx.lint.engine import lint_source
from phalanx.lint.libraries import (
    ACCELERATOR_COLLECTIVES,
    ACCELERATOR_LOCAL,
    ACCELERATOR_SHARDED,
    FABRIC_COLLECTIVES,
    FABRIC_LOCAL,
    FABRIC_SHARDED,
)
from phalanx.lint.rules import BY_CODE

ACCELERATE = "import torch\nfrom accelerate import Accelerator\naccelerator = Accelerator()\n"
FABRIC = "import torch\nimport lightning as L\nfabric = L.Fabric(devices=2)\n"


def found(source: str, code: str = "PX301") -> list[tuple[int, str]]:
    return [(f.line, f.message) for f in lint_source("t.py", source, [BY_CODE[code]])]


def _public(cls) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


@pytest.mark.parametrize("library", ["accelerate", "lightning"])
def test_every_public_member_of_the_installed_versions_is_classified(library):
    """A new version's member cannot go unclassified silently (the bench extra installs
    both; without it the test says so)."""
    if library == "accelerate":
        cls = pytest.importorskip("accelerate", reason="the bench extra (Accelerate) is "
                                  "not installed").Accelerator
        tables = (ACCELERATOR_COLLECTIVES.keys(), ACCELERATOR_SHARDED, ACCELERATOR_LOCAL)
    else:
        cls = pytest.importorskip("lightning.fabric", reason="the bench extra (Lightning) "
                                  "is not installed").Fabric
        tables = (FABRIC_COLLECTIVES.keys(), FABRIC_SHARDED, FABRIC_LOCAL)
    known = set().union(*tables)
    assert _public(cls) - known == set(), "classify them in phalanx/lint/libraries.py"
    assert known - _public(cls) == set()  # no stale entry
    assert sum(map(len, tables)) == len(known)  # each in one table only


def test_the_new_users_accelerate_script_gets_all_three():
    source = ACCELERATE + (
        "for step in range(10):\n"
        "    loss = torch.zeros(())\n"
        "    if accelerator.is_main_process:\n"
        "        avg = accelerator.reduce(loss, reduction='mean')\n"
        "        allv = accelerator.gather(loss)\n"
        "        accelerator.wait_for_everyone()\n"
        "        accelerator.save(avg, 'avg.pt')\n"   # local: silent
        "        accelerator.save_model(allv, 'out')\n")  # a collective only when sharded
    assert [line for line, _ in found(source)] == [7, 8, 9]
    assert "`accelerator.wait_for_everyone()` (a barrier) under `if " \
           "accelerator.is_main_process:`" in found(source)[2][1]


def test_fabrics_collectives_under_global_zero():
    source = FABRIC + (
        "if fabric.is_global_zero:\n"
        "    fabric.barrier()\n"
        "    fabric.save('ckpt.pt', {})\n"
        "    fabric.print('saved')\n"        # local
        "    fabric.log('loss', 1.0)\n"       # local (its loggers write on rank 0)
        "if fabric.global_rank == 0:\n"
        "    total = fabric.all_reduce(torch.ones(()))\n")
    assert [line for line, _ in found(source)] == [5, 6, 10]


@pytest.mark.parametrize("decorator, test, tier", [
    ("@accelerator.on_main_process", "accelerator.is_main_process", "PX301"),
    # each machine's main process: a split only with two ranks on a machine (not proven)
    ("@accelerator.on_local_main_process", "accelerator.is_local_main_process", "PX303"),
    ("@accelerator.on_process(process_index=1)", "accelerator.process_index == 1", "PX301")])
def test_a_main_process_decorator_guards_its_function(decorator, test, tier):
    source = ACCELERATE + f"{decorator}\ndef report(x):\n    accelerator.wait_for_everyone()\n" \
        "    accelerator.print(x)\n"
    assert [(line, f"which runs it only if `{test}`" in message)
            for line, message in found(source, tier)] == [(6, True)]


def test_what_every_process_reaches_is_silent():
    """One step outside each proof: every process joins, or the receiver is unknown."""
    source = ACCELERATE + (
        "with accelerator.main_process_first():\n"     # every process, staggered
        "    data = list(range(4))\n"
        "loss = accelerator.reduce(torch.ones(()))\n"
        "if accelerator.is_main_process:\n"
        "    accelerator.wait_for_everyone()\n"
        "else:\n"
        "    accelerator.wait_for_everyone()\n"       # both arms join
        "if accelerator.sync_gradients:\n"             # the same on every process
        "    accelerator.wait_for_everyone()\n"
        "if accelerator.is_main_process:\n"
        "    other.reduce(loss)\n"                    # not an Accelerator
        "    accelerator.unwrap_model(loss)\n")
    assert found(source) == []


def test_without_the_library_imported_the_names_are_nobodys():
    source = "import torch\nif is_main_process:\n    accelerator.wait_for_everyone()\n" \
             "    fabric.barrier()\n"
    assert found(source) == []


def test_an_accelerator_under_another_name_is_known():
    source = ("from accelerate import Accelerator\nclass T:\n"
              "    def __init__(self):\n        self.acc = Accelerator()\n"
              "    def end(self):\n        if self.acc.is_main_process:\n"
              "            self.acc.wait_for_everyone()\n")
    assert [line for line, _ in found(source)] == [7]
