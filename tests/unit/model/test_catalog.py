"""The hardware catalog: its figures agree with the sources it cites."""

from __future__ import annotations

import pytest

from pdfleet.model import catalog


def test_catalog_kv_sizes_match_reference() -> None:
    assert catalog.MODELS["Llama-3.1-8B"].kv_bytes_per_token() == 131072
    assert catalog.MODELS["Llama-3.1-70B"].kv_bytes_per_token() == 327680
    assert catalog.MODELS["Llama-3.1-8B"].total_params == pytest.approx(8.03e9, rel=0.01)
    assert catalog.MODELS["Llama-3.1-70B"].total_params == pytest.approx(70.6e9, rel=0.01)
    small = catalog.MODELS["Llama-3.2-1B"]  # tied embeddings: the lm_head is the input embedding
    assert small.kv_bytes_per_token() == 32768 and small.total_params == pytest.approx(1.24e9, rel=0.01)
    assert catalog.model("meta-llama/Llama-3.2-1B-Instruct") is small
    # [PERF §2.6] KV table: 32k tokens (4 GiB) over 400G RoCE ≈ 107 ms at ~40 GB/s; we use Mooncake's η 0.71
    assert catalog.LINKS["roce-400g"].transfer_time(4 * 2**30) == pytest.approx(0.107, rel=0.15)
    assert catalog.LINKS["pcie-gen4"].transfer_time(2**30) == pytest.approx(0.043, rel=0.05)
