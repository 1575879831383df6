"""Conformance script: Hugging Face Accelerate with a stateful DataLoader
(benchmarks/conformance; see common.py and accelerate_script.py).

The same training code as accelerate_script.py, but the prepared DataLoader is a
torchdata `StatefulDataLoader` (`DataLoaderConfiguration(use_stateful_dataloader=True)`),
whose position `save_state` stores and `load_state` restores; per Accelerate's
checkpointing guide ("When using `use_stateful_dataloader=True`, restore the dataloader
with `load_state` instead of additionally calling `skip_first_batches`"), no batches are
skipped by hand. https://huggingface.co/docs/accelerate/usage_guides/checkpoint
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accelerate_script import main  # noqa: E402

if __name__ == "__main__":
    main(stateful=True)
