"""phalanx bench without processes: the FLOP formula against a hand count, the peak
table, and the report generator on known results."""

from __future__ import annotations

import pytest

from phalanx.bench import flops, stats
from phalanx.bench import markdown as report
from phalanx.models import GPTConfig, MiniGPT


def test_flops_per_token_matches_a_hand_count():
    model = MiniGPT(GPTConfig(block_size=16, n_layer=1, n_head=2, n_embd=32, dropout=0.0,
                              bias=True, activation_checkpointing=False))
    # wte 256·32 (tied with the head, counted once); one block: ln 2·32, qkv 32·96+96,
    # proj 32·32+32, ln 2·32, fc 32·128+128, proj 128·32+32; final ln 2·32; wpe excluded
    by_hand = 256 * 32 + (64 + 32 * 96 + 96 + 32 * 32 + 32 + 64 + 32 * 128 + 128 +
                          128 * 32 + 32) + 64
    assert flops.matmul_params(model) == by_hand == 20960
    assert flops.flops_per_token(by_hand, 1, 32, 16) == 6 * 20960 + 12 * 1 * 32 * 16 == 131904


def test_peaks_and_mfu():
    assert flops.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert flops.peak_flops("NVIDIA A100-SXM4-40GB") == 312e12
    assert flops.peak_flops("CPU") is None and flops.mfu(1e6, 1e6, "CPU", 1) is None
    assert flops.mfu(494.5e3, 1e9, "NVIDIA H200", 1) == pytest.approx(0.5)
    assert flops.peak_flops("NVIDIA H100 PCIe") == 756e12  # not the SXM part's 989
    assert flops.peak_flops("NVIDIA H100 80GB HBM3 MIG 1g.10gb") is None  # a slice
    assert "unknown device 'NVIDIA B999'" in flops.no_mfu_reason("NVIDIA B999")
    assert "on CPU" in flops.no_mfu_reason("CPU")


RESULTS = {
    "config": {"model": {"n_layer": 4, "n_embd": 128, "block_size": 128},
               "train": {"micro_batch_size": 16, "grad_accum": 1, "precision": "fp32"}},
    "world_size": 2, "threads": 1, "device_name": "CPU",
    "versions": {"torch": "2.13.0", "accelerate": "1.15.0", "lightning": "2.6.6"},
    "repeats": 3, "steps": 10, "tokens_per_step": 4096, "matmul_params": 820352,
    "flops_per_token": 5.7e6, "peak_flops": None, "mfu": None,
    "peers": {"plain": [0.30, 0.32, 0.31], "accelerate": [0.40, 0.40, 0.40],
              "fabric": [0.33, 0.35, 0.34], "phalanx": [0.28, 0.29, 0.30]},
    "profile": {"phases_ms": {"data": 1.0, "forward": 90.0, "backward": 200.0,
                              "optimizer": 9.0},
                "step_ms": 290.0, "no_comm_step_ms": 280.0, "exposed_comm_ms": 10.0,
                "exposed_comm_fraction": 10 / 290, "allreduce_alone_ms": 4.0,
                "rank_wait_ms": 5.0},
    "defaults": [{"label": "torch's DDP static_graph", "setting": "DDP static_graph",
                  "ours": "True", "torch": "False", "times": [0.30, 0.31, 0.32]}],
    "scaling": {"weak": [{"ranks": 1, "global_batch": 16, "ms": 200.0, "tokens_per_s": 10240.0,
                          "efficiency": [1.0, 1.0, 1.0]},
                         {"ranks": 2, "global_batch": 32, "ms": 210.0,
                          "tokens_per_s": 19504.8, "efficiency": [0.952, 0.94, 0.96]}],
                "strong": [{"ranks": 1, "global_batch": 32, "ms": 400.0,
                            "tokens_per_s": 10240.0, "efficiency": [1.0, 1.0, 1.0]},
                           {"ranks": 2, "global_batch": 32, "ms": 250.0,
                            "tokens_per_s": 16384.0, "efficiency": [0.8, 0.75, 0.85]}]}}


def test_report_shows_ratios_breakdown_and_efficiency(tmp_path):
    path = report.write(RESULTS, tmp_path)
    text = path.read_text()
    # paired ratios: phalanx/plain per round = 0.28/0.30, 0.29/0.32, 0.30/0.31
    assert ("| plain | 310.0 (300.0–320.0) | 13,213 | **0.933** (0.906–0.968) | <= 1.00 | met |"
            in text)
    assert ("| accelerate | 400.0 (400.0–400.0) | 10,240 | **0.725** (0.700–0.750) | <= 0.95 "
            "| met |" in text)
    assert ("| DDP static_graph | True | False | 310.0 (300.0–320.0) | **0.935** (0.933–0.938) "
            "faster |" in text)
    assert "on its own takes 4.0 ms" in text and "(mean over steps of slowest − mean rank time): 5.0 ms" in text
    assert "Phalanx: 290.0 ms/step, **14,124 tokens/s**" in text
    assert "| backward | 200.0 | 67% |" in text
    assert "**10.0 ms = 3.4% of the step**" in text
    assert "| weak | 2 | 32 | 210.0 | 19,505 | **95.2%** (94.0%–96.0%) | >= 95% |" in text
    assert "| strong | 2 | 32 | 250.0 | 16,384 | **80.0%** (75.0%–85.0%) |  |" in text
    assert "MFU: not reported on CPU" in text
    assert (tmp_path / "peers.png").stat().st_size > 1000
    assert (tmp_path / "scaling.png").stat().st_size > 1000


def test_paired_ratio_interval_and_verdict():
    a, b = [1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 4.0, 6.0, 8.0, 10.0]
    assert stats.ratio_interval(a, b) == (0.5, 0.5, 0.5)  # every round: exactly half
    mid, low, high = stats.ratio_interval([1.0, 1.1, 0.9, 1.05, 0.95], [1.0] * 5)
    assert mid == 1.0 and low < 1.0 < high
    assert stats.verdict(low, high, 1.0) == "within noise"
    assert stats.verdict(0.90, 0.94, 0.95) == "met"
    assert stats.verdict(0.96, 1.02, 0.95) == "missed"
    with pytest.raises(ValueError, match="got 2 and 1 rounds"):
        stats.paired_ratios([1.0, 2.0], [1.0])
