"""The layout space: every candidate spends exactly N GPUs, and each cut says why with its figures."""

from __future__ import annotations

from pdfleet.model import catalog
from pdfleet.plan.space import (
    THRESHOLDS,
    Hardware,
    Layout,
    Load,
    PoolShape,
    candidates,
    fits,
    prune,
    search_space,
)

H100_8B = Hardware(catalog.GPUS["H100-SXM"], catalog.MODELS["Llama-3.1-8B"], catalog.LINKS["roce-400g"])


def _load(rate: float = 3.0, prompt: float = 6000.0, output: float = 128.0, long_share: float = 0.25) -> Load:
    return Load(rate, prompt, output, {t: (long_share, 23000.0) for t in THRESHOLDS}, tpot_s=0.06)


def test_every_candidate_spends_exactly_the_gpus_and_each_kind_is_there() -> None:
    layouts = list(candidates(4, (1, 2)))
    assert layouts and all(lay.gpus == 4 for lay in layouts)
    assert {lay.kind for lay in layouts} == {"colocated", "disagg", "hybrid"}
    assert all(lay.threshold is not None for lay in layouts if lay.kind == "hybrid")
    assert all(lay.threshold is None for lay in layouts if lay.kind != "hybrid")
    assert len(set(layouts)) == len(layouts)
    assert all(p.tp in (1, 2) for lay in layouts for p in (lay.colocated, lay.prefill, lay.decode) if p)


def test_tp_stays_within_the_sizes_given() -> None:
    assert all(
        p.tp == 1 for lay in candidates(3, (1,)) for p in (lay.colocated, lay.prefill, lay.decode) if p
    )


def test_a_model_that_does_not_fit_is_cut_with_its_sizes() -> None:
    hw = Hardware(catalog.GPUS["L40S"], catalog.MODELS["Llama-3.1-70B"], catalog.LINKS["roce-400g"])
    why = fits(hw, 1)
    assert why is not None and why.startswith("model does not fit:") and "GiB per GPU at TP 1" in why
    assert fits(H100_8B, 1) is None
    keep, cut = search_space(2, _load(), hw)
    assert not keep and cut and all("model does not fit" in c.reason for c in cut)


def test_tp_must_divide_the_attention_heads() -> None:
    assert fits(H100_8B, 3) == "Llama-3.1-8B has 32 attention heads, not divisible by TP 3"


def test_a_link_that_cannot_carry_the_transfers_is_cut() -> None:
    hw = Hardware(catalog.GPUS["H100-SXM"], catalog.MODELS["Llama-3.1-8B"], catalog.LINKS["tcp"])
    layout = Layout(None, PoolShape(3, 1, 8192), PoolShape(1, 1, 2048))
    why = prune(layout, _load(rate=20, prompt=23000, long_share=1.0), hw)
    assert why is not None and why.startswith("KV link cannot carry the transfer rate: each decode")
    assert "tcp link would be busy" in why
    assert prune(layout, _load(rate=0.5, prompt=2000), H100_8B) is None


def test_a_decode_batch_the_kv_cache_cannot_hold_is_cut() -> None:
    layout = Layout(colocated=PoolShape(2, 1, 8192))
    heavy = Load(40, 30000, 2000, {t: (0.0, 0.0) for t in THRESHOLDS}, tpot_s=0.1)
    why = prune(layout, heavy, H100_8B)
    assert why is not None and why.startswith("KV cache cannot hold the decode batch: a colocated instance")


def test_a_threshold_that_routes_the_same_requests_as_a_smaller_one_is_cut() -> None:
    load = Load(3, 6000, 128, {4096: (0.25, 23000.0), 8192: (0.25, 23000.0), 16384: (0.2, 25000.0)}, 0.06)
    lay = Layout(PoolShape(2, 1, 8192), PoolShape(1, 1, 8192), PoolShape(1, 1, 2048), 8192)
    assert prune(lay, load, H100_8B) == (
        "routes the same requests as long>=4096 (no prompt has 4096-8191 effective tokens)"
    )
    assert prune(Layout(lay.colocated, lay.prefill, lay.decode, 16384), load, H100_8B) is None


def test_the_search_keeps_or_cuts_every_candidate() -> None:
    keep, cut = search_space(4, _load(), H100_8B, (1, 2))
    assert len(keep) + len(cut) == len(list(candidates(4, (1, 2))))
    assert all(c.reason for c in cut)


def test_the_fleets_own_layouts_outside_the_lists_are_searched_and_a_twin_stands_for_its_threshold() -> None:
    # the fleet's threshold 6000 and a colocated budget of 4096: in none of the lists
    load = Load(
        3,
        6000,
        128,
        {4096: (0.25, 23000.0), 6000: (0.22, 23500.0), 8192: (0.2, 24000.0), 16384: (0.1, 27000.0)},
        0.06,
    )
    pools = (PoolShape(2, 1, 8192), PoolShape(1, 1, 8192), PoolShape(1, 1, 2048))
    hybrid = Layout(*pools, 6000)
    off_budget = Layout(colocated=PoolShape(4, 1, 4096))
    assert hybrid not in set(candidates(4, (1,))) and off_budget not in set(candidates(4, (1,)))
    grid, _ = search_space(4, load, H100_8B, (1,))
    keep, cut = search_space(
        4, load, H100_8B, (1,), [hybrid, off_budget, Layout(colocated=PoolShape(2, 1, 8192))]
    )
    assert keep == [*grid, hybrid, off_budget]  # added after the grid's; a 2-GPU layout is not a 4-GPU plan's
    # a threshold outside the lists never cuts the grid's: long>=8192 routing as 6000 does is still searched
    same = Load(3, 6000, 128, {**load.long, 6000: load.long[8192]}, 0.06)
    assert Layout(*pools, 8192) in search_space(4, same, H100_8B, (1,))[0]
    # a fleet threshold routing as a kept grid one does: that twin stands for it (validate matches twins)
    twin_load = Load(3, 6000, 128, {**load.long, 6000: (0.25, 23000.0)}, 0.06)
    keep, _ = search_space(4, twin_load, H100_8B, (1,), [hybrid])
    assert hybrid not in keep and Layout(*pools, 4096) in keep
    # cut by the same rules as the grid's, saying whose it is
    heavy = Load(40, 30000, 2000, {t: (0.0, 0.0) for t in (*THRESHOLDS, 6000)}, tpot_s=0.1)
    _, cut = search_space(4, heavy, H100_8B, (1,), [off_budget])
    assert next(c.reason for c in cut if c.layout == off_budget).startswith(
        "the fleet's own layout: KV cache cannot hold the decode batch"
    )
