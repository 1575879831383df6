"""Training FLOPs of MiniGPT and model FLOPs utilisation (MFU).

The formula (PaLM, appendix B; as nanoGPT uses it): per trained token,
    6 · N  +  12 · n_layer · n_embd · block_size
where N counts the parameters that do matrix multiplies (every parameter except a learned
position table — none with rotary positions; a tied token embedding counts once, as the
output projection; an untied head counts as its own V×C matrix), and the second term is
attention's QK^T and AV (forward 2·2·L·T·d, ×3 for backward). N follows the vocabulary
the model was built for (the tokenizer's); `models.shapes.minigpt_matmul_params` is the
same count from the config alone.
"""

from __future__ import annotations

from phalanx.runtime import peaks


def matmul_params(model) -> int:
    """Parameters that take part in matrix multiplies (all but a learned position table;
    each shared tensor once)."""
    skip = {id(p) for name, p in model.named_parameters() if name.endswith("wpe.weight")}
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def flops_per_token(n_params: int, n_layer: int, n_embd: int, block_size: int) -> float:
    return 6.0 * n_params + 12.0 * n_layer * n_embd * block_size


def peak_flops(device_name: str) -> float | None:
    """The dense bf16 peak of a known GPU name (e.g. 'NVIDIA H100 80GB HBM3'; the table in
    `phalanx.runtime.peaks`), else None (a CPU, a MIG slice, an unknown device)."""
    row = peaks.peak_for(device_name)
    return None if row is None else row.bf16_flops


def mfu(tokens_per_s: float, per_token: float, device_name: str, n_devices: int) -> float | None:
    return peaks.mfu(tokens_per_s, per_token, device_name, n_devices)


def no_mfu_reason(device_name: str) -> str:
    """Why a bench result has no MFU, in one line."""
    if device_name == "CPU":
        return "MFU: not reported on CPU (no dense peak for a CPU); tokens/s only."
    return f"MFU: {peaks.unknown_reason(device_name)}; tokens/s only."
