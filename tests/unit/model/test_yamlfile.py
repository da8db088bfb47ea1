"""Reading operators' YAML: duplicate keys and syntax errors are ValidationErrors naming file:line:col;
nesting, alias expansion and control characters are bounded; no other YAML loader exists in the tree."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.gateway.keys import load_keys
from pdfleet.gateway.policy import load_policy
from pdfleet.model.inventory import load_inventory
from pdfleet.model.profile_loader import load_profile
from pdfleet.model.yamlfile import excerpt, key_path, parse_yaml, read_yaml

REPO = Path(__file__).resolve().parents[3]


def test_a_duplicate_key_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "dup.yml"
    path.write_text("a: 1\nb:\n  c: 2\n  c: 3\n")
    with pytest.raises(ValidationError, match=rf"{path}:4:3: .*duplicate key 'c'"):
        read_yaml(path)


def test_syntax_errors_and_missing_files_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ValidationError, match=rf"{bad}:\d+:\d+: invalid YAML"):
        read_yaml(bad)
    with pytest.raises(ValidationError, match="file not found"):
        read_yaml(tmp_path / "nope.yml")


def test_only_plain_data_is_built(tmp_path: Path) -> None:
    path = tmp_path / "tagged.yml"
    path.write_text("a: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ValidationError, match="invalid YAML"):
        read_yaml(path)
    (tmp_path / "ok.yml").write_text("a: [1, {b: c}]\n")
    assert read_yaml(tmp_path / "ok.yml") == {"a": [1, {"b": "c"}]}


# The classic "billion laughs": 9 levels of 9 aliases, ~10^9 strings once expanded (issue 18, C3).
BOMB = "".join(
    [f'l0: &l0 ["{"lol" * 3}", "{"lol" * 3}", "{"lol" * 3}", "{"lol" * 3}", "{"lol" * 3}"]\n']
    + [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]\n" for i in range(1, 10)]
)


def test_billion_laughs_is_refused_in_well_under_a_second(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yml"
    path.write_text(BOMB)
    # CPU seconds, not wall time: a loaded machine may deschedule the test; an expansion would take minutes
    started = time.process_time()
    with pytest.raises(ValidationError, match=rf"^{path}: aliases expand the document to more than \d+"):
        read_yaml(path)
    assert time.process_time() - started < 0.5


def test_aliases_within_the_bound_still_work(tmp_path: Path) -> None:
    path = tmp_path / "ok.yml"
    path.write_text("base: &b {port: 1, gpus: [0, 1]}\na: *b\nb: {<<: *b, port: 2}\n")
    assert read_yaml(path) == {
        "base": {"port": 1, "gpus": [0, 1]},
        "a": {"port": 1, "gpus": [0, 1]},
        "b": {"port": 2, "gpus": [0, 1]},
    }


def test_a_document_read_again_is_a_fresh_copy_and_a_bad_one_fails_every_time(tmp_path: Path) -> None:
    # parsed documents are kept by content: what one caller changes, the next must not see
    text = "a: &x {ports: [1, 2]}\nb: *x\n"
    first = parse_yaml(text, "one.yml")
    first["a"]["ports"].append(3)
    again = parse_yaml(text, "one.yml")
    assert again == {"a": {"ports": [1, 2]}, "b": {"ports": [1, 2]}}
    assert again["a"] is again["b"]  # an alias is still one object, as PyYAML builds it
    for _ in range(2):
        with pytest.raises(ValidationError, match=r"bad\.yml:2:1: invalid YAML"):
            parse_yaml("a: [\n", "bad.yml")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: " + "[" * 5000 + "]" * 5000 + "\n", r":1:\d+: invalid YAML: nested deeper than 64 levels"),
        ("a: &a [*a]\n", r": a\[0\]: an alias refers to a node that contains it"),
        # each alias adds 40 levels: nesting through aliases is bounded as well
        (
            "a: &a " + "[" * 40 + "1" + "]" * 40 + "\nb: &b " + "[" * 40 + "*a" + "]" * 40 + "\n",
            r": b(\[0\])+: aliases nest the document deeper than 64 levels",
        ),
    ],
    ids=["deep", "recursive-alias", "deep-through-aliases"],
)
def test_nesting_is_bounded(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "deep.yml"
    path.write_text(text)
    with pytest.raises(ValidationError, match=re.escape(str(path)) + expected):
        read_yaml(path)


def test_invalid_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yml"
    path.write_bytes("a: 1\nmodel: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ValidationError, match=rf"^{path}:2: not valid UTF-8 \(byte 0xe9 at offset 15\)"):
        read_yaml(path)


@pytest.mark.parametrize(
    ("text", "where", "char"),
    [
        ('model: {id: "x\\nExecStartPre=/bin/sh"}\n', "model.id", "U+000A"),
        ("model:\n  id: |\n    x\n    y\n", "model.id", "U+000A"),
        ('a: ["ok", "x\\ry"]\n', "a[1]", "U+000D"),
        ('a: "x\\u2028y"\n', "a", "U+2028"),
        ('a: "x\\x85y"\n', "a", "U+0085"),
        ('a: {"k\\ney": 1}\n', "a", "U+000A"),
    ],
    ids=["escaped-newline", "block-scalar", "carriage-return", "line-separator", "next-line", "in-a-key"],
)
def test_control_characters_are_refused_with_file_and_key(
    tmp_path: Path, text: str, where: str, char: str
) -> None:
    path = tmp_path / "ctl.yml"
    path.write_text(text)
    expected = rf"^{re.escape(str(path))}: {re.escape(where)}: .*{re.escape(char)}"
    with pytest.raises(ValidationError, match=expected):
        read_yaml(path)


def test_values_may_hold_control_characters_when_the_caller_says_so(tmp_path: Path) -> None:
    path = tmp_path / "vars.yml"
    path.write_text('motd: "two\\nlines"\n')
    assert read_yaml(path, check_values=False) == {"motd": "two\nlines"}
    path.write_text('"two\\nlines": 1\n')
    with pytest.raises(ValidationError, match="a key .* contains the control character U\\+000A"):
        read_yaml(path, check_values=False)


def test_secret_files_keep_their_content_out_of_messages(tmp_path: Path) -> None:
    cases = (
        'keys: [{sha256: "sk-secret-value\\nX"}]\n',
        "keys: [sk-secret-value\n",
        "sk-secret-value: 1\nsk-secret-value: 2\n",
    )
    for text in cases:
        with pytest.raises(ValidationError) as err:
            parse_yaml(text, "keys.yaml", secret=True)
        assert "secret" not in str(err.value), str(err.value)
        assert str(err.value).startswith("keys.yaml"), str(err.value)


def test_long_values_are_quoted_as_a_short_masked_excerpt() -> None:
    key = "sk-pdfleet-" + "A" * 43
    shown = excerpt(key)
    assert key[5:] not in shown and "54 characters" in shown
    assert excerpt("short") == "'short'"
    # issue 27 N13: a key short enough to fit the limit was printed whole
    assert excerpt("sk-user-0123456789abcdef") == "'sk-u'... (24 characters)"
    assert excerpt("198.18.0.1:8082/simple") == "'198.18.0.1:8082/simple'"  # a URL, a host: shown
    assert excerpt("gpu-node-1") == "'gpu-node-1'"


PDFLEET_SOURCES = [
    *sorted((REPO / "pdfleet").rglob("*.py")),
    *sorted((REPO / "roles").rglob("*.py")),
    *sorted((REPO / "bench").rglob("*.py")),
    REPO / "tasks.py",
]
_OTHER_LOADERS = re.compile(
    r"yaml\.(safe_load|load|full_load|unsafe_load|load_all|safe_load_all|"
    r"compose|parse)\b|\bYAML\(|import ruamel|CLoader|CSafeLoader"
)


def test_the_bounded_loader_is_the_only_yaml_loader() -> None:
    offenders = [
        f"{p.relative_to(REPO)}:{n}: {line.strip()}"
        for p in PDFLEET_SOURCES
        if p != REPO / "pdfleet/model/yamlfile.py"
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if _OTHER_LOADERS.search(line)
    ]
    assert not offenders, "YAML read outside pdfleet.model.yamlfile:\n" + "\n".join(offenders)
    assert PDFLEET_SOURCES and any("parse_yaml" in p.read_text() for p in PDFLEET_SOURCES)


def _bomb_profile(tmp_path: Path) -> Exception:
    (tmp_path / "bomb.yml").write_text(BOMB)
    return _raised(lambda: load_profile("bomb", tmp_path))


def _bomb_inventory(tmp_path: Path) -> Exception:
    (tmp_path / "inv.yml").write_text(BOMB)
    return _raised(lambda: load_inventory(tmp_path / "inv.yml"))


def _bomb_policy(tmp_path: Path) -> Exception:
    (tmp_path / "policy.yaml").write_text(BOMB)
    return _raised(lambda: load_policy(tmp_path / "policy.yaml"))


def _bomb_keys(tmp_path: Path) -> Exception:
    path = tmp_path / "keys.yaml"
    path.write_text(BOMB)
    path.chmod(0o600)
    return _raised(lambda: load_keys(path))


def _raised(call: Callable[[], object]) -> Exception:
    """The exception a call raises (a test failure when it returns)."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the test checks the type
        return exc
    raise AssertionError("the bomb was accepted")


@pytest.mark.parametrize(
    ("kind", "load"),
    [
        ("profile", _bomb_profile),
        ("inventory", _bomb_inventory),
        ("gateway policy", _bomb_policy),
        ("gateway keys file", _bomb_keys),
    ],
    ids=["profile", "inventory", "policy", "keys"],
)
def test_every_kind_of_file_refuses_the_bomb_quickly(
    tmp_path: Path, kind: str, load: Callable[[Path], Exception]
) -> None:
    started = time.process_time()  # CPU seconds of this process: not the machine's load
    exc = load(tmp_path)
    assert time.process_time() - started < 0.5, kind
    assert isinstance(exc, ValidationError), f"{kind}: {exc!r}"
    assert "aliases expand the document" in str(exc) and "\n" not in str(exc), str(exc)


def test_key_paths_use_dots_and_brackets() -> None:
    assert key_path(("pools", "decode", "gpus", 1)) == "pools.decode.gpus[1]"
    assert key_path(()) == "(top level)"
    assert key_path(("stages", True)) == "stages.true"  # a key YAML read as a boolean
