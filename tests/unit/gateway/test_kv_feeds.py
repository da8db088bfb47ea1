"""The KV-events source through a running gateway on loopback: a policy alias listing its colocated
instances' publishers (libzmq PUBs sending what vLLM 0.33's publisher sends) routes a token-id prompt to
the instance whose events hold its prefix and counts that instance's cached tokens; a text prompt counts
none unless the alias names the model's tokenizer directory; a stopped publisher is counted and its
instance holds nothing cached; the policy refuses a malformed events list. End to end, both sources on
the same agentic traffic, token ids and text chat: two simulator processes running the model's tokenizer
and chat template and publishing their events behind a gateway, aliases reading them and aliases reading
the gateway's own prefix index; each alias's estimated cached tokens within 10% of the simulators'
`vllm:prefix_cache_hits` increase over its sessions."""

from __future__ import annotations

import asyncio
import json
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from pdfleet.bench.launch import RouterProcess, SimProcess
from pdfleet.bench.procs import free_port
from pdfleet.errors import ValidationError
from pdfleet.gateway.kv_feeds import wanted_of
from pdfleet.gateway.prefix_index import prompt_blocks
from pdfleet.gateway.prompt_ids import engine_ids, load_route_tokenizer
from pdfleet.metrics.scrape import scrape_metrics
from pdfleet.model.vllm_release_data import NEWEST
from pdfleet.sim.stream import FILLER
from tests.unit.gateway.helpers import Env, load_test_policy, run
from tests.unit.model.helpers import wheel_events
from tests.unit.sim.helpers import MODEL, chat_model_dir, kv_config

IDS = list(range(5000, 5000 + 80))  # five 16-token blocks
SETTINGS = {"threshold_on": "effective", "colocated_choice": "prefix_load"}
EVENTS = {"kv_events": ["tcp://a:1", "tcp://b:2"], "kv_events_release": "0.33.0"}  # two colocated instances'
COLO2 = ["http://127.0.0.1:1", "http://127.0.0.1:2"]


def _stored(c: dict[str, Any], ids: list[int]) -> bytes:
    hashes = list(range(900, 900 + len(ids) // 16))
    event = c["BlockStored"](
        block_hashes=hashes, parent_block_hash=None, token_ids=ids, block_size=16, lora_id=None,
        medium="GPU", lora_name=None,
    )  # fmt: skip
    return msgspec.msgpack.Encoder().encode(c["KVEventBatch"](ts=0.0, events=[event]))


def _served(raw: bytes) -> str:
    return str(json.loads(raw)["served_by"])


def test_a_token_id_prompt_goes_where_the_events_hold_its_prefix(tmp_path: Path) -> None:
    c = wheel_events("0.33.0")

    async def scenario() -> None:
        ctx = zmq.Context()
        pubs = [ctx.socket(zmq.PUB) for _ in range(2)]
        ports = [p.bind_to_random_port("tcp://127.0.0.1") for p in pubs]
        events = [f"tcp://127.0.0.1:{port}" for port in ports]

        def models(colo: str, dis: str) -> dict[str, Any]:
            route = {"colocated": [colo, dis], "kv_events": events, "kv_events_release": "0.33.0"}
            return {"llama": route}

        try:
            async with Env(tmp_path, models=models, decider=SETTINGS) as env:
                assert env.gw is not None
                feeds = env.gw.gateway.deciding.feeds
                second = env.dis.url  # the alias's second colocated instance
                seq = 0
                while feeds.states()[second].batches == 0:  # a PUB drops what precedes the subscription
                    pubs[1].send_multipart([b"", seq.to_bytes(8, "big"), _stored(c, IDS)])
                    seq += 1
                    await asyncio.sleep(0.02)
                body = {"model": "llama", "prompt": [*IDS, 1, 2, 3], "max_tokens": 4}
                for _ in range(3):  # round robin would alternate; the events keep it on the second
                    st, _, raw = await env.post("/v1/completions", body)
                    assert st == 200 and _served(raw) == "dis"
                est = "pdfleet_gateway_prefix_estimate_cached_tokens_total"
                upstream = second.removeprefix("http://")
                assert await env.metric(est, pool="colocated", upstream=upstream) == 3 * 80
                st, _, raw = await env.post("/v1/completions", {"model": "llama", "prompt": "x" * 400})
                assert st == 200 and await env.metric(est, upstream=upstream) == 3 * 80  # text: none
                pubs[1].close(linger=0)  # the second engine stops
                problems = "pdfleet_gateway_kv_events_problems_total"
                for _ in range(500):
                    if await env.metric(problems, upstream=upstream, kind="disconnected") == 1:
                        break
                    await asyncio.sleep(0.02)
                assert await env.metric(problems, upstream=upstream, kind="disconnected") == 1
                before = await env.metric(est)
                st, _, raw = await env.post("/v1/completions", body)
                assert st == 200 and await env.metric(est) == before  # unknown: nothing counted cached
        finally:
            for p in pubs:
                p.close(linger=0)
            ctx.term()

    run(scenario())


def test_each_instance_s_replay_socket_reaches_its_feed(tmp_path: Path) -> None:
    """Each colocated and each prefill instance's replay socket, in its publishers' order."""
    route = {
        "colocated": COLO2,
        **EVENTS,
        "kv_events_replay": ["tcp://a:11", "tcp://[::1]:12"],
        "disagg": "http://127.0.0.1:8090",
        "prefill": ["http://127.0.0.1:3"],
        "prefill_kv_events": ["tcp://p:5"],
        "prefill_kv_events_replay": ["tcp://p:15"],
    }
    wanted = wanted_of(load_test_policy(tmp_path, models={"llama": route}).routes.values())
    assert [(w.host, w.port, w.replay) for w in wanted.values()] == [
        ("a", 1, ("a", 11)),
        ("b", 2, ("::1", 12)),
        ("p", 5, ("p", 15)),
    ]
    plain = wanted_of(
        load_test_policy(tmp_path, models={"llama": {"colocated": COLO2, **EVENTS}}).routes.values()
    )
    assert [w.replay for w in plain.values()] == [None, None]


@pytest.mark.parametrize(
    ("route", "expected"),
    [
        ({"kv_events": ["tcp://127.0.0.1:5557"]}, r"kv_events: 1 endpoints for 2 colocated instances"),
        ({"kv_events": ["tcp://a:1", "udp://b:2"], "kv_events_release": "0.33.0"}, r"kv_events\[1\]: 'udp"),
        (
            {"kv_events": ["tcp://a:1", "tcp://b:2"], "kv_events_release": "0.10.0"},
            r"formats tabled: 0\.11\.0",
        ),
        ({"kv_events_release": "0.33.0"}, r"kv_events_release: set only with kv_events"),
        ({"prefill_kv_events": ["tcp://a:1"]}, r"prefill_kv_events: set only with kv_events"),
        ({**EVENTS, "prefill_kv_events": ["tcp://a:1"]}, r"prefill_kv_events: 1 endpoints for 0 prefill"),
        (
            {**EVENTS, "prefill": ["http://127.0.0.1:3"], "prefill_kv_events": ["tcp//a:1"]},
            r"prefill_kv_events\[0\]: 'tcp//a:1' is not tcp://HOST:PORT",
        ),
        ({"kv_events_replay": ["tcp://a:1"]}, r"kv_events_replay: set only with kv_events"),
        ({**EVENTS, "kv_events_replay": ["tcp://a:1"]}, r"kv_events_replay: 1 endpoints for 2 kv_events"),
        ({**EVENTS, "kv_events_replay": ["tcp://a:1", "b:2"]}, r"kv_events_replay\[1\]: 'b:2' is not"),
        ({"prefill_kv_events_replay": ["tcp://a:1"]}, r"prefill_kv_events_replay: set only with kv_events"),
        (
            {**EVENTS, "prefill": ["http://127.0.0.1:3"], "prefill_kv_events": ["tcp://a:1"]}
            | {"prefill_kv_events_replay": ["tcp://a:2", "tcp://a:3"]},
            r"prefill_kv_events_replay: 2 endpoints for 1 prefill_kv_events",
        ),
        (
            {**EVENTS, "prefill": ["http://127.0.0.1:3"], "prefill_kv_events": ["tcp://a:1"]}
            | {"prefill_kv_events_replay": ["a:2"]},
            r"prefill_kv_events_replay\[0\]: 'a:2' is not tcp://HOST:PORT",
        ),
    ],
)
def test_the_policy_refuses_a_malformed_events_list(
    tmp_path: Path, route: dict[str, Any], expected: str
) -> None:
    models = {"llama": {"colocated": ["http://127.0.0.1:1", "http://127.0.0.1:2"], **route}}
    with pytest.raises(ValidationError, match=expected):
        load_test_policy(tmp_path, models=models)
    with pytest.raises(ValidationError, match=r"decider\.cache_source: a policy takes KV events per alias"):
        load_test_policy(tmp_path, decider={"cache_source": "kv_events", **SETTINGS})


def _sessions(rng: random.Random) -> tuple[list[list[int]], list[tuple[int, int]]]:
    """Three agent sessions of token ids (1-3K at first, 300-900 more a turn), five turns each,
    interleaved."""
    sessions = [[rng.randrange(1, 30_000) for _ in range(rng.randrange(1000, 3000))] for _ in range(3)]
    return sessions, [(s, rng.randrange(300, 900)) for _ in range(5) for s in range(3)]


@pytest.mark.procs
def test_both_sources_estimate_the_simulators_prefix_hits_on_the_same_traffic(tmp_path: Path) -> None:
    """Two simulators running the model's tokenizer and chat template (its directory) behind a gateway,
    with prefix_load and effective. Alias `events` reads their KV events and `index` the gateway's own
    index, both sent token-id agent sessions; `chat_events` and `chat_index` likewise, sent text chat
    sessions and naming the same directory (`tokenizer:`), so a chat prompt's blocks are the engine's
    rendered ids (without it the events source counted a text prompt 0 cached). Each alias gets its own
    random sessions (neither finds another's blocks). Per alias, the gateway's estimate metric against
    the simulators' `vllm:prefix_cache_hits` increase over its sessions: within 10%."""
    model_dir = chat_model_dir(tmp_path / "model")
    tokenizer = load_route_tokenizer(str(model_dir), tmp_path / "policy.yml", "tokenizer")
    assert tokenizer is not None
    ports = [free_port(), free_port()]
    sims = [
        SimProcess(
            [
                MODEL,
                "--tokenizer",
                str(model_dir),
                "--sim-time-scale",
                "0.05",
                "--kv-events-config",
                json.dumps({"enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{port}"}),
            ]
        )  # fmt: skip
        for port in ports
    ]

    def models(_colo: str, _dis: str) -> dict[str, Any]:
        urls = [sim.url for sim in sims]
        events = {"kv_events": [f"tcp://127.0.0.1:{port}" for port in ports], "kv_events_release": NEWEST}
        chat = {"tokenizer": str(model_dir)}
        return {
            "events": {"colocated": urls, "upstream_model": MODEL, **events},
            "index": {"colocated": urls, "upstream_model": MODEL},
            "chat_events": {"colocated": urls, "upstream_model": MODEL, **events, **chat},
            "chat_index": {"colocated": urls, "upstream_model": MODEL, **chat},
        }

    async def send(env: Env, alias: str, rng: random.Random, prompt: Any) -> list[int]:
        """One turn; the prompt's ids on the engine (a chat's answer joins its messages)."""
        if isinstance(prompt, list) and isinstance(prompt[0], int):
            st, _, raw = await env.post(
                "/v1/completions", {"model": alias, "prompt": prompt, "max_tokens": 2}
            )
            assert st == 200, raw
            return list(prompt)
        body = {"model": alias, "messages": prompt, "max_tokens": 2}
        ids = engine_ids(tokenizer, body)
        st, _, raw = await env.post("/v1/chat/completions", body)
        assert st == 200 and ids is not None, raw
        reply = json.loads(raw)
        assert reply["usage"]["prompt_tokens"] == len(ids), (reply["usage"], len(ids))  # the engine's count
        prompt.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
        return ids

    async def arm(env: Env, alias: str, rng: random.Random) -> tuple[float, float]:
        assert env.gw is not None
        feeds = env.gw.gateway.deciding.feeds
        chat = alias.startswith("chat")
        sessions, turns = _chat_sessions(rng) if chat else _sessions(rng)
        before = sum(scrape_metrics(s.url).get("vllm:prefix_cache_hits_total", 0.0) for s in sims)
        for s, grow in turns:
            prompt: Any = sessions[s]
            if chat:
                prompt.append({"role": "user", "content": "".join(rng.choice(FILLER) for _ in range(grow))})
            ids = await send(env, alias, rng, prompt)
            if alias.endswith("events"):  # its blocks' events, published at its prefill's steps
                blocks, whole = prompt_blocks(ids, 16, 4.0), len(ids) // 16 * 16
                for _ in range(3000):
                    if any(feeds.cached_tokens(u, blocks, len(ids)) >= whole for u in feeds.states()):
                        break
                    await asyncio.sleep(0.01)
            if not chat:
                prompt += [rng.randrange(1, 30_000) for _ in range(grow)]
        hits = sum(scrape_metrics(s.url).get("vllm:prefix_cache_hits_total", 0.0) for s in sims) - before
        estimate = await env.metric("pdfleet_gateway_prefix_estimate_cached_tokens_total", model=alias)
        return estimate, hits

    async def scenario() -> dict[str, tuple[float, float]]:
        async with Env(tmp_path, models=models, decider=SETTINGS) as env:
            assert env.gw is not None
            feeds = env.gw.gateway.deciding.feeds
            rng = random.Random(32)
            for _ in range(3000):  # both subscriptions made (a PUB drops what precedes a subscription)
                if all(state.up for state in feeds.states().values()):
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)  # the SUB's subscription message reaches the PUB after the handshake
            return {
                alias: await arm(env, alias, rng)
                for alias in ("events", "index", "chat_events", "chat_index")
            }

    with ThreadPoolExecutor(len(sims)) as pool:  # both start at once (each ~2-3 s of imports)
        started = [pool.submit(sim.__enter__) for sim in sims]
    try:
        for future in started:
            future.result()
        figures = run(scenario())
    finally:
        for sim in sims:
            sim.__exit__(None, None, None)
    print(f"estimated cached tokens vs vllm:prefix_cache_hits increase: {figures}")
    for alias, (estimate, hits) in figures.items():
        assert hits > 10_000 and abs(estimate - hits) <= 0.10 * hits, (alias, estimate, hits)


def _chat_sessions(rng: random.Random) -> tuple[list[list[dict[str, str]]], list[tuple[int, int]]]:
    """Three agent sessions of text chat messages (a system prompt of 600-1800 filler words, one token each,
    each turn a user message of 200-600 more, the answer joining the context), five turns each,
    interleaved."""
    sessions = [
        [{"role": "system", "content": "".join(rng.choice(FILLER) for _ in range(rng.randrange(600, 1800)))}]
        for _ in range(3)
    ]
    return sessions, [(s, rng.randrange(200, 600)) for _ in range(5) for s in range(3)]


@pytest.mark.procs
def test_the_pd_candidate_s_estimate_comes_from_its_prefill_instance_s_events(tmp_path: Path) -> None:
    """A P/D pool of one producer publishing its KV events and one consumer behind the real vllm-router
    (round robin), beside a colocated simulator publishing too. Agent sessions sent to the P/D pool (the
    override header): the gateway's estimate for the disagg pool, read from the producer's events, within
    10% of the producer's `vllm:prefix_cache_hits` increase."""
    colo_port, prefill_port, side = free_port(), free_port(), free_port()

    def events(port: int) -> list[str]:
        return [
            "--kv-events-config",
            json.dumps({"enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{port}"}),
        ]

    fast = [MODEL, "--sim-time-scale", "0.05"]
    colo = SimProcess([*fast, *events(colo_port)])
    producer = SimProcess(
        [*fast, *events(prefill_port), "--kv-transfer-config", kv_config("kv_producer")],
        env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side)},
    )
    consumer = SimProcess([*fast, "--kv-transfer-config", kv_config("kv_consumer")])

    async def scenario(router: RouterProcess) -> tuple[float, float]:
        def models(_colo: str, _dis: str) -> dict[str, Any]:
            route = {
                "colocated": [colo.url], "disagg": router.url, "upstream_model": MODEL,
                "kv_events": [f"tcp://127.0.0.1:{colo_port}"], "kv_events_release": NEWEST,
                "prefill": [producer.url], "prefill_kv_events": [f"tcp://127.0.0.1:{prefill_port}"],
            }  # fmt: skip
            return {"llama": route}

        async with Env(tmp_path, models=models, decider=SETTINGS) as env:
            assert env.gw is not None
            feeds = env.gw.gateway.deciding.feeds
            for _ in range(3000):  # both subscriptions made (a PUB drops what precedes a subscription)
                if len(feeds.states()) == 2 and all(state.up for state in feeds.states().values()):
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
            rng = random.Random(33)
            sessions, turns = _sessions(rng)
            before = scrape_metrics(producer.url).get("vllm:prefix_cache_hits_total", 0.0)
            for s, grow in turns:
                ids = sessions[s]
                body = {"model": "llama", "prompt": ids, "max_tokens": 2}
                st, headers, raw = await env.post("/v1/completions", body, {"X-Pdfleet-Pool": "disagg"})
                assert st == 200 and headers["X-Pdfleet-Pool"] == "disagg", raw
                blocks, whole = prompt_blocks(ids, 16, 4.0), len(ids) // 16 * 16
                for _ in range(3000):  # its blocks' events, published at the producer's prefill steps
                    if feeds.cached_tokens(producer.url, blocks, len(ids)) >= whole:
                        break
                    await asyncio.sleep(0.01)
                ids += [rng.randrange(1, 30_000) for _ in range(grow)]
            hits = scrape_metrics(producer.url).get("vllm:prefix_cache_hits_total", 0.0) - before
            estimate = await env.metric("pdfleet_gateway_prefix_estimate_cached_tokens_total", pool="disagg")
            return estimate, hits

    with colo, producer, consumer, RouterProcess([producer.url], [consumer.url]) as router:
        estimate, hits = run(scenario(router))
    print(f"P/D estimate vs the producer's vllm:prefix_cache_hits increase: {estimate:.0f} vs {hits:.0f}")
    assert hits > 10_000 and abs(estimate - hits) <= 0.10 * hits, (estimate, hits)
