"""The lab's model mirror: a small model repository in Hugging Face's layout, made by the lab (config,
tokenizer, a few MiB of safetensors with their index), at two revisions with their manifests, served over
HTTP with byte ranges (a static server that answers `Range:` is what lets an interrupted copy continue).

Layout under the served root: `<model id>/<revision>/{files, manifest.json}`, as a site's mirror holds it
(pdfleet.fleet.weights). The bytes are derived from the revision's name, so every lab builds the same
files and a profile can pin them.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import re
import struct
import sys
from collections.abc import Sequence
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pdfleet.model.weights import MANIFEST_NAME, WeightsManifest, manifest_of_dir
from pdfleet.sim.stream import FILLER

LAB_MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # the simulator's catalog knows it by this id
LAB_REVISIONS = ("lab-r1", "lab-r2")  # lab-r2: the "other revision" a decode pool is pinned to
SHARDS = 2
SHARD_BYTES = 2 * 1024 * 1024  # two 2 MiB shards: enough for a copy to be interrupted half way
SPECIAL_TOKENS = ("<s>", "</s>")
# Llama 3's chat header and turn-end tokens, special as in Meta's tokenizer (single ids, never split)
CHAT_TOKENS = ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
# Meta-Llama-3-8B-Instruct's chat template, verbatim (its tokenizer_config.json): vLLM renders a chat request
# with it, so the lab's simulators prefill, and the gateway hashes, what a Llama 3 deployment's engine would
# (the lab's BOS is <s>: the template writes `bos_token`, whatever it is)
CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


def _stream(seed: str, size: int) -> bytes:
    """`size` bytes derived from `seed` (SHA-256 in counter mode): the same everywhere, unlike urandom."""
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(f"{seed}/{counter}".encode()).digest()
        counter += 1
    return bytes(out[:size])


def _safetensors(name: str, data: bytes) -> bytes:
    """A valid safetensors file holding one U8 tensor `name` of these bytes (8-byte header length,
    JSON header, data)."""
    header = json.dumps({name: {"dtype": "U8", "shape": [len(data)], "data_offsets": [0, len(data)]}})
    header_bytes = header.encode().ljust((len(header) + 7) // 8 * 8)
    return struct.pack("<Q", len(header_bytes)) + header_bytes + data


# The words the lab tokenizer holds as single tokens (with their leading space, as byte-level BPE spells
# them): the simulator's filler words, so its streamed text re-tokenizes to the count it reports.
LAB_WORDS = FILLER


def _byte_chars() -> list[str]:
    """GPT-2's byte-level alphabet: the printable character each byte 0..255 is written as."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def lab_tokenizer() -> dict[str, Any]:
    """A byte-level BPE tokenizer.json (HF `tokenizers` loads it): the 256 bytes, merges spelling each of
    LAB_WORDS as one token, and <s>, </s> and Llama 3's chat tokens as special tokens."""
    chars = _byte_chars()
    vocab = {c: i for i, c in enumerate(chars)}
    merges: list[str] = []
    for word in dict.fromkeys(LAB_WORDS):
        spelled = "".join(chars[b] for b in word.encode())
        for end in range(2, len(spelled) + 1):
            if spelled[:end] not in vocab:
                merges.append(f"{spelled[: end - 1]} {spelled[end - 1]}")
                vocab[spelled[:end]] = len(vocab)
    added = [
        {
            "id": len(vocab) + i,
            "content": tok,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, tok in enumerate((*SPECIAL_TOKENS, *CHAT_TOKENS))
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }


def lab_model_files(revision: str) -> dict[str, bytes]:
    """The repository's files at a revision: config, generation config, tokenizer, shards and index (made
    once a process: ~0.3 s, and the lab tests' process brings the lab up some ten times)."""
    return dict(_model_files(revision))


@functools.cache
def _model_files(revision: str) -> tuple[tuple[str, bytes], ...]:
    """lab_model_files' files, as an immutable value to keep."""
    tokenizer = lab_tokenizer()
    vocab_size = len(tokenizer["model"]["vocab"]) + len(tokenizer["added_tokens"])
    ids = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    bos, eos = (ids[tok] for tok in SPECIAL_TOKENS)
    tokenizer_config = {
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
    }
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "vocab_size": vocab_size,
        "max_position_embeddings": 131072,
        "torch_dtype": "uint8",
        "_pdfleet_lab_revision": revision,
    }
    files: dict[str, bytes] = {
        "config.json": (json.dumps(config, indent=1) + "\n").encode(),
        "generation_config.json": (json.dumps({"bos_token_id": bos, "eos_token_id": eos}) + "\n").encode(),
        "tokenizer_config.json": (json.dumps(tokenizer_config) + "\n").encode(),
        "special_tokens_map.json": b'{"bos_token": "<s>", "eos_token": "</s>"}\n',
        "tokenizer.json": (json.dumps(tokenizer) + "\n").encode(),
    }
    weight_map: dict[str, str] = {}
    for index in range(1, SHARDS + 1):
        name = f"model-{index:05d}-of-{SHARDS:05d}.safetensors"
        tensor = f"layers.{index - 1}.weight"
        files[name] = _safetensors(tensor, _stream(f"{revision}/{name}", SHARD_BYTES))
        weight_map[tensor] = name
    index_doc = {"metadata": {"total_size": SHARDS * SHARD_BYTES}, "weight_map": weight_map}
    files["model.safetensors.index.json"] = (json.dumps(index_doc, indent=1) + "\n").encode()
    return tuple(files.items())


def build_lab_models(root: Path) -> list[WeightsManifest]:
    """Write every lab revision under `root` (skipped when its manifest already lists the same files)."""
    manifests = []
    for revision in LAB_REVISIONS:
        directory = root / LAB_MODEL / revision
        manifest_file = directory / MANIFEST_NAME
        files = lab_model_files(revision)
        if manifest_file.exists():
            manifest = WeightsManifest.model_validate_json(manifest_file.read_text())
            have = {f.path: f.sha256 for f in manifest.files}
            if have == {path: hashlib.sha256(data).hexdigest() for path, data in files.items()}:
                manifests.append(manifest)
                continue
        directory.mkdir(parents=True, exist_ok=True)
        for path, data in files.items():
            tmp = directory / f".{path}.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, directory / path)
        manifest = manifest_of_dir(directory, LAB_MODEL, revision)
        tmp = directory / f".{MANIFEST_NAME}.tmp"
        tmp.write_text(manifest.to_json())
        os.replace(tmp, manifest_file)
        manifests.append(manifest)
    return manifests


_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


class RangeHandler(SimpleHTTPRequestHandler):
    """http.server's static files, plus single `Range: bytes=N-[M]` requests (206) that curl -C - sends."""

    def send_head(self) -> Any:
        match = _RANGE.match(self.headers.get("Range", ""))
        path = Path(self.translate_path(self.path))
        if match is None or not path.is_file():
            return super().send_head()
        size = path.stat().st_size
        start = int(match.group(1))
        end = min(int(match.group(2)), size - 1) if match.group(2) else size - 1
        if start >= size or end < start:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        handle = path.open("rb")
        handle.seek(start)
        self.send_response(206)
        self.send_header("Content-Type", self.guess_type(str(path)))
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        self._remaining = end - start + 1
        return handle

    def copyfile(self, source: Any, outputfile: Any) -> None:
        """Only the requested range of a 206 answer; the whole file otherwise."""
        remaining = getattr(self, "_remaining", None)
        if remaining is None:
            super().copyfile(source, outputfile)
            return
        while remaining > 0:
            chunk = source.read(min(1 << 16, remaining))
            if not chunk:
                break
            outputfile.write(chunk)
            remaining -= len(chunk)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
        sys.stderr.write(f"{self.address_string()} {format % args}\n")


def make_server(bind: str, port: int, directory: Path) -> ThreadingHTTPServer:
    """A range-answering static server of `directory` (port 0: any free port)."""

    def handler(*args: Any) -> RangeHandler:
        return RangeHandler(*args, directory=str(directory))

    return ThreadingHTTPServer((bind, port), handler)


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m pdfleet.lab.model_mirror --bind ADDR --directory DIR PORT`: serve until killed."""
    parser = argparse.ArgumentParser(prog="python -m pdfleet.lab.model_mirror", description=main.__doc__)
    parser.add_argument("--bind", required=True, help="address to listen on (the lab's bridge)")
    parser.add_argument("--directory", required=True, type=Path, help="the mirror's root")
    parser.add_argument("port", type=int, help="TCP port")
    args = parser.parse_args(argv)
    make_server(args.bind, args.port, args.directory).serve_forever()


if __name__ == "__main__":
    main()
