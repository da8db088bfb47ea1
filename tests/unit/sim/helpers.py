"""Shared bits of the simulator's tests: the model they serve and small HTTP/P-D helpers."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import math
import os
import random
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pdfleet.bench.launch import SimProcess
from pdfleet.lab.model_mirror import lab_model_files
from pdfleet.sim.kv_library import BUFFER_BYTES, scaled
from pdfleet.sim.stream import FILLER

if TYPE_CHECKING:
    from openai.types import CompletionUsage

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def kv_config(role: str, connector: str = "NixlConnector", **extra: Any) -> str:
    """A --kv-transfer-config JSON for `connector` (the NixlConnector unless named) in `role`."""
    return json.dumps({"kv_connector": connector, "kv_role": role, **extra})


def post_json(
    url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    """POST a JSON body (with extra headers); (status, JSON answer), error statuses included."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


# ---- P/D pairs moving KV bytes through a real transfer library (NIXL, Mooncake's engine) -------------------
KV_BYTES_8B = 131072  # the KV bytes of one Llama-3.1-8B token (the simulator's model)
LIBRARY_FRACTION = 0.01  # of each request's KV bytes, through the library


def library_env(library: str, library_dir: str, **more: str) -> dict[str, str]:
    """kv-transfer.env's settings for the simulator's `library` (PDFLEET_SIM_KV_*, LIBRARY_FRACTION of the
    bytes), its installed directory first on PYTHONPATH, and `more` (the library's own settings)."""
    path = os.pathsep.join(p for p in (library_dir, os.environ.get("PYTHONPATH", "")) if p)
    return {
        "PYTHONPATH": path,
        "PDFLEET_SIM_KV_LIBRARY": library,
        "PDFLEET_SIM_KV_BYTES_FRACTION": str(LIBRARY_FRACTION),
        **more,
    }


@contextlib.contextmanager
def library_pair(
    connector: str, env: dict[str, str], producer_env: dict[str, str]
) -> Iterator[tuple[SimProcess, SimProcess]]:
    """A `connector` producer and consumer simulator with `env` (library_env's), the producer's own settings
    (its side channel's or bootstrap port) in `producer_env`; stopped when the block ends."""
    common = [MODEL, "--sim-time-scale", "0.1", "--sim-log-interval", "1", "--kv-transfer-config"]
    producer = SimProcess(
        [*common, kv_config("kv_producer", connector)], env={**env, **producer_env}, timeout=60
    )
    consumer = SimProcess([*common, kv_config("kv_consumer", connector)], env=env, timeout=60)
    with producer as p, consumer as d:
        yield p, d


def stream_chats(router_url: str, count: int = 3) -> list[CompletionUsage]:
    """`count` streamed chats of ~1K prompt tokens each, 4 tokens out, through `router_url` (the OpenAI SDK):
    each one's usage."""
    import openai  # only the tests that stream import the SDK

    client = openai.OpenAI(base_url=router_url + "/v1", api_key="unused", max_retries=0, timeout=60)
    usages = []
    for n in range(count):
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"{n} " + "y" * 4000}],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        usage = [c for c in stream][-1].usage
        assert usage is not None
        usages.append(usage)
    return usages


def library_bytes(usages: list[CompletionUsage]) -> int:
    """The bytes the library moves for these requests: each prompt's 16-token blocks, each LIBRARY_FRACTION
    of a block's KV bytes in whole words (`kv_library.scaled`)."""
    total = 0
    for usage in usages:
        blocks = -(-usage.prompt_tokens // 16)
        total += blocks * scaled(usage.prompt_tokens * KV_BYTES_8B, blocks, LIBRARY_FRACTION, BUFFER_BYTES)
    return total


CLONE_NEWNET = 0x40000000  # <sched.h>


@contextlib.contextmanager
def loopback_netns() -> Iterator[None]:
    """This thread in a network namespace of its own, holding only `lo` (up), until the block ends; then back.

    A network namespace belongs to a thread (Linux): the sockets this thread opens meanwhile, the threads it
    starts and the processes it spawns are in the new one, so a library that listens on every interface
    (Mooncake's transfer engine: its handshake and TCP acceptors bind 0.0.0.0 and [::], no option changes
    it) is reachable from loopback only. Needs CAP_SYS_ADMIN (root here and in CI); without it, a skip."""
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if libc.unshare(CLONE_NEWNET) != 0:
            reason = os.strerror(ctypes.get_errno())
            pytest.skip(f"no network namespace of its own for this test (unshare: {reason}; needs root)")
        try:
            subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=10)  # noqa: S607 - iproute2
            assert socket.if_nameindex() == [(1, "lo")], socket.if_nameindex()
            yield
        finally:
            if libc.setns(home, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the test's network namespace")
    finally:
        os.close(home)


def wait_for(pred: Callable[[], Any], timeout: float = 10.0) -> None:
    """Poll `pred` until it is true, or fail after `timeout` wall seconds."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on a clock of its own: the wait for the next timer takes no wall time (the clock jumps
    to it), and the loop's own work takes none of the clock's but one float step an iteration (so a clock
    read twice has moved, as a real one has). What a test measures in loop time (a step's lateness, an
    intake's length) is then what the code scheduled, however loaded the machine is. Only for code that
    waits on its own timers (no threads, no sockets); one that spins is stopped after WALL_LIMIT_S."""

    WALL_LIMIT_S = 30.0

    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0
        select = self._selector.select
        deadline = time.monotonic() + self.WALL_LIMIT_S

        def jump(timeout: float | None = None) -> Any:
            if time.monotonic() > deadline:
                raise RuntimeError(f"a virtual-time loop ran {self.WALL_LIMIT_S:g} wall s: it spins")
            ready = select(0 if timeout is not None else None)
            if not ready and timeout is not None:
                self._now = max(self._now + timeout, math.nextafter(self._now, math.inf))
            return ready

        self._selector.select = jump  # type: ignore[method-assign]

    def time(self) -> float:
        """The loop's clock: seconds the loop waited, none of the work between."""
        return self._now


class FakeTransport:
    """Stands in for a streaming client's connection: keeps what the step loop writes."""

    def __init__(self, closing: bool = False) -> None:
        self.writes: list[bytes] = []
        self.closing = closing

    def write(self, data: bytes) -> None:
        """Keep one write (one HTTP chunk)."""
        self.writes.append(data)

    def is_closing(self) -> bool:
        """True once the client is gone."""
        return self.closing


def chunk_events(frame: bytes) -> list[dict[str, Any]]:
    """The SSE events of one HTTP/1.1 chunked frame, as JSON (`[DONE]` left out)."""
    size, _, rest = frame.partition(b"\r\n")
    data = rest[: int(size, 16)]
    assert rest[int(size, 16) :] == b"\r\n", frame
    events = [e for e in data.decode().split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events), events
    return [json.loads(e.removeprefix("data: ")) for e in events if e != "data: [DONE]"]


# ---- a small real tokenizer, built here (no download) ---------------------------------------------------
WORDS = tuple(w.strip() for w in FILLER)  # the simulator's own filler words


def words_text(n_words: int, seed: int) -> str:
    """Text of `n_words` words (some with suffixes), reproducible from the seed."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) + rng.choice(("", "s", "ed", "ing")) for _ in range(n_words))


def random_words(n_words: int, seed: int) -> str:
    """Text of `n_words` random lowercase words: few repeat, so a tokenizer's word cache does not help."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return " ".join("".join(rng.choices(letters, k=rng.randint(3, 7))) for _ in range(n_words))


def make_tokenizer(path: Path, vocab_size: int = 300) -> Path:
    """Train a byte-level BPE tokenizer on filler-like text and save it as path (a tokenizer.json).

    Its small vocabulary makes it slow, about 2 ms per 1K tokens here, like a real tokenizer on a busy
    host: enough to show when tokenizing blocks the event loop.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["[UNK]"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([words_text(50, i) for i in range(2000)], trainer)
    tok.save(str(path))
    return path


# A Llama-3-style chat template over the lab tokenizer's <s> and </s> (pdfleet.lab.model_mirror)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def chat_model_dir(path: Path, template: str | None = CHAT_TEMPLATE) -> Path:
    """A tokenizer directory as a model's: the lab model's tokenizer files, its tokenizer_config.json with
    `template` as its chat_template (None: none)."""
    files = lab_model_files("lab-r1")
    path.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "special_tokens_map.json"):
        (path / name).write_bytes(files[name])
    config = json.loads(files["tokenizer_config.json"])
    config.pop("chat_template", None)  # the lab model's own (Llama 3's), replaced by `template`
    if template is not None:
        config["chat_template"] = template
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path
