"""The one YAML loader of pdfleet, for every file it reads (profiles, inventories, the gateway's policy and
keys files): plain data only, duplicate keys refused, and bounded before anything is built.

Bounds: nesting at most MAX_DEPTH levels; aliases may expand the document to at most MAX_EXPANSION times
its own node count (at least EXPANSION_FLOOR nodes), so an 854-byte "billion laughs" file is refused in
milliseconds instead of taking gigabytes; no key (and, unless the caller allows it, no value) may hold a
control character, since values end up one per line in unit, env and config files. Every problem is a
ValidationError naming the file and where in it.
"""

from __future__ import annotations

import copy
import functools
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pdfleet.errors import ValidationError

MAX_DEPTH = 64
PARSED_KEPT = 256  # parsed documents kept (see _parse_kept)
MAX_EXPANSION = 10
EXPANSION_FLOOR = 10_000
# C0 and C1 controls, DEL, and the Unicode line/paragraph separators YAML and editors treat as line breaks.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class _Loader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys and documents nested deeper than MAX_DEPTH."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        """Compose one node, refusing to go deeper than MAX_DEPTH (PyYAML recurses per level)."""
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict:
    """Build a dict, failing on a key written twice in the same mapping, with its line (keys that `<<:`
    merges in may be overridden, as YAML's merge key intends)."""
    written = sum(1 for key_node, _ in node.value if key_node.tag != "tag:yaml.org,2002:merge")
    loader.flatten_mapping(node)  # puts the merged pairs first
    merged = len(node.value) - written
    result: dict[Any, Any] = {}
    explicit: set[Any] = set()
    for index, (key_node, value_node) in enumerate(node.value):
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = index >= merged and key in explicit
        except TypeError:  # a list or mapping as a key
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                "found a key that is not a scalar",
                key_node.start_mark,
            ) from None
        if duplicate:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {excerpt(key)}",
                key_node.start_mark,
            )
        if index >= merged:
            explicit.add(key)
        result[key] = loader.construct_object(value_node, deep=deep)
    return result


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def excerpt(value: Any, limit: int = 40) -> str:
    """A short, masked rendering of a value for error messages: files can hold secrets, so a long string
    shows only its start and its length, and control characters are escaped. A string that could be a
    key (12 characters or more, one token: no space, dot, slash, colon or @, as URLs, paths, host names
    and sentences have) is masked at any length: a key of 38 characters was printed whole."""
    text = repr(value)
    if isinstance(value, str) and (len(text) > limit or _key_like(value)):
        return f"{value[:4]!r}... ({len(value)} characters)"
    if len(text) <= limit:
        return text
    return f"a {type(value).__name__} ({len(text)} characters)"


def _key_like(value: str) -> bool:
    """Whether a string has the shape of an API key or token (see excerpt)."""
    return len(value) >= 12 and not any(c in value for c in " ./:@")


def control_character(text: str) -> str | None:
    """The first control character in text as `U+000A (LINE FEED)`, or None."""
    found = _CONTROL.search(text)
    if found is None:
        return None
    char = found.group()
    name = unicodedata.name(char, "") or {"\n": "LINE FEED", "\r": "CARRIAGE RETURN", "\t": "TAB"}.get(
        char, "control character"
    )
    return f"U+{ord(char):04X} ({name})"


@dataclass
class _Walk:
    """One pass over the composed node graph: expanded size and height per node, control characters."""

    source: str
    check_values: bool
    secret: bool
    memo: dict[int, tuple[int, int]] = field(default_factory=dict)
    active: set[int] = field(default_factory=set)
    written: int = 0

    def fail(self, where: tuple[Any, ...], node: yaml.Node, problem: str) -> ValidationError:
        line = f" (line {node.start_mark.line + 1})" if node.start_mark else ""
        return ValidationError(f"{self.source}: {key_path(where)}: {problem}{line}")

    def scalar(self, node: yaml.ScalarNode, where: tuple[Any, ...], is_key: bool) -> None:
        """Refuse control characters in keys always, in values when asked."""
        if not (is_key or self.check_values):
            return
        char = control_character(node.value)
        if char is None:
            return
        what = "a key" if is_key else "the value"
        shown = "" if self.secret else f" {excerpt(node.value)}"
        raise self.fail(
            where,
            node,
            f"{what}{shown} contains the control character {char}; keys and values "
            "must be one line of printable text",
        )

    def visit(self, node: yaml.Node, where: tuple[Any, ...], depth: int) -> tuple[int, int]:
        """(expanded node count, height) of a node; refuses cycles and depth over MAX_DEPTH."""
        key = id(node)
        if key in self.active:
            raise self.fail(where, node, "an alias refers to a node that contains it (a recursive alias)")
        if key in self.memo:
            size, height = self.memo[key]
            if depth + height - 1 > MAX_DEPTH:
                raise self.fail(where, node, f"aliases nest the document deeper than {MAX_DEPTH} levels")
            return size, height
        if depth > MAX_DEPTH:
            raise self.fail(where, node, f"aliases nest the document deeper than {MAX_DEPTH} levels")
        self.active.add(key)
        self.written += 1
        size, height = 1, 0
        if isinstance(node, yaml.ScalarNode):
            self.scalar(node, where, is_key=False)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                s, h = self.visit(item, (*where, index), depth + 1)
                size, height = size + s, max(height, h)
        elif isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                label = key_node.value if isinstance(key_node, yaml.ScalarNode) else "(key)"
                if isinstance(key_node, yaml.ScalarNode):
                    self.scalar(key_node, where, is_key=True)
                    self.written += 1
                    ks, kh = 1, 1
                else:
                    ks, kh = self.visit(key_node, where, depth + 1)
                vs, vh = self.visit(value_node, (*where, label), depth + 1)
                size, height = size + ks + vs, max(height, kh, vh)
        self.active.discard(key)
        self.memo[key] = (size, height + 1)
        return size, height + 1


def key_path(where: tuple[Any, ...]) -> str:
    """A location as `pools.prefill.gpus[1]` (`(top level)` for the document itself)."""
    text = ""
    for part in where:
        if isinstance(part, bool):  # a mapping key YAML read as a boolean (`on:`, `yes:`)
            part = str(part).lower()
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _syntax_error(source: str, exc: yaml.YAMLError, secret: bool) -> ValidationError:
    """A YAML error as `file:line:col: invalid YAML: problem` (no problem text for secret files)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        what = " ".join(p for p in (exc.context, exc.problem) if p)
        return ValidationError(f"{where}: invalid YAML" + ("" if secret else f": {what}"))
    if isinstance(exc, yaml.reader.ReaderError):
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        return ValidationError(
            f"{source}: invalid YAML: the control character U+{code:04X} (character "
            f"{exc.position + 1}) is not allowed in YAML"
        )
    return ValidationError(f"{source}: invalid YAML" + ("" if secret else f": {exc}"))


def _text(data: str | bytes, source: str) -> str:
    """The file's text; bytes that are not UTF-8 are an error naming the line."""
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ValidationError(
            f"{source}:{line}: not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start}); save the file as UTF-8"
        ) from None


def parse_yaml(
    data: str | bytes, source: str | Path, *, check_values: bool = True, secret: bool = False
) -> Any:
    """Parse one YAML document within the bounds of this module; any problem is a ValidationError.

    `check_values=False` lets values hold control characters (inventories: Ansible vars pdfleet never
    writes anywhere); `secret=True` keeps file content (parser excerpts, values) out of every message.
    """
    name = str(source)
    text = _text(data, name)
    if secret:
        return _parse(text, name, check_values, secret)
    return copy.deepcopy(_parse_kept(text, name, check_values))  # callers may change what they get


@functools.lru_cache(maxsize=PARSED_KEPT)
def _parse_kept(text: str, name: str, check_values: bool) -> Any:
    """_parse of a text that is not secret, kept: one process reads the same profile many times (render,
    checks, tests), and the pure-Python parser takes ~10 ms where a deep copy of its data takes ~0.1 ms.
    A problem raises, and nothing is kept."""
    return _parse(text, name, check_values, False)


def _parse(text: str, name: str, check_values: bool, secret: bool) -> Any:
    """parse_yaml's work on one text: bounded composition, the walk, then construction."""
    try:
        loader = _Loader(text)
    except yaml.YAMLError as exc:  # the reader refuses non-printable characters up front
        raise _syntax_error(name, exc, secret) from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        walk = _Walk(name, check_values, secret)
        size, _ = walk.visit(node, (), 1)
        allowed = max(EXPANSION_FLOOR, MAX_EXPANSION * walk.written)
        if size > allowed:
            raise ValidationError(
                f"{name}: aliases expand the document to more than {allowed} nodes "
                f"({walk.written} written); refusing to build it"
            )
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise _syntax_error(name, exc, secret) from None
    finally:
        loader.dispose()


def read_yaml(path: Path, *, check_values: bool = True) -> Any:
    """Read and parse one YAML file (see parse_yaml); a missing or unreadable file is a ValidationError."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ValidationError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise ValidationError(f"{path}: is a directory, not a YAML file") from None
    except OSError as exc:
        raise ValidationError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return parse_yaml(data, path, check_values=check_values)
