"""Synthetic Python-looking text for test corpora."""

from __future__ import annotations

import random


def make_text(n_bytes: int, seed: int = 0) -> str:
    """Python-looking text with learnable structure, deterministic in `seed`."""
    rng = random.Random(seed)
    names = ["alpha", "beta", "gamma", "delta", "value", "index", "result", "items"]
    lines = []
    while sum(len(x) + 1 for x in lines) < n_bytes:
        a, b = rng.choice(names), rng.choice(names)
        lines.append(rng.choice([
            f"def {a}_{b}({a}, {b}):", f"    return {a} + {b}", f"    {a} = {b} * {rng.randint(0, 9)}",
            f"for {a} in range({rng.randint(1, 99)}):", f"    if {a} > {b}:", "        pass"]))
    return "\n".join(lines)[:n_bytes]
