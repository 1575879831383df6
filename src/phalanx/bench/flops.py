"""Training FLOPs of MiniGPT and model FLOPs utilisation (MFU).

The formula (PaLM, appendix B; as nanoGPT uses it): per trained token,
    6 · N  +  12 · n_layer · n_embd · block_size
where N counts the parameters that do matrix multiplies (every parameter except the
position embedding; the token embedding counts once, as the tied output projection), and
the second term is attention's QK^T and AV (forward 2·2·L·T·d, ×3 for backward).
"""

from __future__ import annotations

# Dense bf16 tensor-core peak FLOP/s (no sparsity), per GPU.
PEAKS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}


def matmul_params(model) -> int:
    """Parameters that take part in matrix multiplies (all but position embeddings)."""
    skip = {id(p) for name, p in model.named_parameters() if name.endswith("wpe.weight")}
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def flops_per_token(n_params: int, n_layer: int, n_embd: int, block_size: int) -> float:
    return 6.0 * n_params + 12.0 * n_layer * n_embd * block_size


def peak_flops(device_name: str) -> float | None:
    """The peak for a known GPU name (e.g. 'NVIDIA H100 80GB HBM3'), else None (CPU)."""
    for key, value in PEAKS.items():
        if key in device_name.upper():
            return value
    return None


def mfu(tokens_per_s: float, per_token: float, device_name: str, n_devices: int) -> float | None:
    peak = peak_flops(device_name)
    return None if peak is None else tokens_per_s * per_token / (peak * n_devices)
