"""A failing rank is named; the launcher does not hang or blame the wrong rank."""

from __future__ import annotations

import pytest

from phalanx.errors import DistributedError
from phalanx.launch.agent import launch_workers


def test_a_crashing_rank_is_named(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text("import os, sys\nsys.exit(3 if os.environ['RANK'] == '1' else 0)\n")
    with pytest.raises(DistributedError) as err:
        launch_workers([str(script)], 2, threads=1)
    assert err.value.ranks == [1]
    assert "rank 1 exited with code 3" in str(err.value)
