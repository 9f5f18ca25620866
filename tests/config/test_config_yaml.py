"""Hostile and broken files: each is refused with a one-line error at the exact line and column."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.config_support import VALID, issues, only_issue, write_config
from veloxd.config import ConfigError, inspect_config, load_config
from veloxd.config.source import MAX_BYTES


@pytest.mark.parametrize("text", ["", "\n\n", "# nothing but a comment\n"])
def test_empty_file(tmp_path: Path, text: str) -> None:
    line, column, path, message = only_issue(write_config(tmp_path, text))
    assert (line, column, path) == (1, 1, "$")
    assert "the file is empty" in message


@pytest.mark.parametrize("text", ["null\n", "# a comment\n~\n", "---\n"])
def test_a_file_holding_only_null_is_not_called_empty(tmp_path: Path, text: str) -> None:
    line, column, path, message = only_issue(write_config(tmp_path, text))
    assert (line, column, path) == (1, 1, "$")
    assert message.startswith("the file holds only null: write 'version: 1'"), message


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ("- version\n- servers\n", "a list"),
        ("just some words\n", "the string 'just some words'"),
    ],
)
def test_top_level_not_a_mapping(tmp_path: Path, text: str, what: str) -> None:
    assert only_issue(write_config(tmp_path, text)) == (
        1,
        1,
        "$",
        f"the top level must be a mapping with 'version' and 'servers', not {what}",
    )


@pytest.mark.parametrize(
    ("text", "line", "column", "fragment"),
    [
        ("version: 1\nservers:\n  coder: [1, 2\n", 4, 1, "expected ',' or ']'"),
        ("version: 1\nservers:\n  coder:\n    model: 'unterminated\n", 5, 1, "found unexpected end of stream"),
        ("version: 1\nservers:\n  coder: x\n   bad: y\n", 4, 7, "mapping values are not allowed here"),
        ("version: 1\n---\nservers: {}\n", 2, 1, "expected a single document in the stream but found another document"),
    ],
)
def test_yaml_syntax_errors(tmp_path: Path, text: str, line: int, column: int, fragment: str) -> None:
    got = issue_in(tmp_path, text)
    assert got[:3] == (line, column, "$")
    assert got[3].startswith("YAML syntax error: ") and fragment in got[3]


@pytest.mark.parametrize(
    ("text", "line", "column"),
    [
        ("version: 1\nservers:\n\tcoder: {}\n", 3, 1),  # tab indentation
        ("version:\t1\nservers: {}\n", 1, 9),  # tab after a colon
    ],
)
def test_tabs(tmp_path: Path, text: str, line: int, column: int) -> None:
    assert issue_in(tmp_path, text) == (line, column, "$", "tab character: YAML indents and separates with spaces only")


def issue_in(tmp_path: Path, text: str) -> tuple[int, int, str, str]:
    """The one problem found in a config of exactly `text`: line, column, JSON path, message."""
    return only_issue(write_config(tmp_path, text, dedent=False))


def test_non_utf8_byte_is_located(tmp_path: Path) -> None:
    path = tmp_path / "veloxd.yaml"
    path.write_bytes(b"version: 1\nservers:\n  caf\xe9:\n")
    path.chmod(0o644)
    result = inspect_config(path)
    assert not result.unreadable
    [issue] = result.issues
    assert (issue.line, issue.column) == (3, 6)
    assert "not UTF-8: byte 0xE9" in issue.message


def test_utf8_bom_is_accepted(tmp_path: Path) -> None:
    path = write_config(tmp_path, VALID)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert list(load_config(path).servers) == ["coder", "chat"]


def test_control_character_is_located(tmp_path: Path) -> None:
    text = "version: 1\nservers: {}\ndescription: 'a\x07b'\n"
    assert issue_in(tmp_path, text) == (3, 16, "$", "character U+0007 is not allowed in YAML")


def test_file_over_the_size_cap(tmp_path: Path) -> None:
    text = VALID + "# " + "x" * MAX_BYTES + "\n"
    line, column, path, message = issue_in(tmp_path, text)
    assert (line, column, path) == (1, 1, "$")
    assert f"the limit is {MAX_BYTES} (1 MiB)" in message


def test_alias_bomb_is_bounded(tmp_path: Path) -> None:
    layers = ['x-a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        layers.append(f"x-{name}: &{name} [" + ", ".join([f"*{prev}"] * 10) + "]")
    text = "version: 1\n" + "\n".join(layers) + "\nservers: {}\n"  # 10**9 strings if expanded
    line, column, path, message = issue_in(tmp_path, text)
    # x-a..x-d expand to 11110 values; x-e's 100000 leaves cross the 100000 budget
    assert (line, column, path) == (6, 1, "$.x-e")
    assert message == "aliases expand to more than 100000 values (an alias bomb?)"


def test_recursive_alias(tmp_path: Path) -> None:
    text = "version: 1\nx-loop: &loop [1, *loop]\nservers: {}\n"
    assert issue_in(tmp_path, text) == (2, 9, "$.x-loop[1]", "recursive alias: a value contains itself")


def test_deep_nesting(tmp_path: Path) -> None:
    text = "version: 1\nx-deep: " + "[" * 200 + "]" * 200 + "\nservers: {}\n"
    # the root mapping is level 1, so the k-th '[' (column 8 + k) is level k + 1: the 64th is too deep
    assert issue_in(tmp_path, text) == (2, 72, "$", "nesting deeper than 64 levels")


def test_duplicate_keys_are_errors_not_last_wins(tmp_path: Path) -> None:
    text = """\
        version: 1
        servers:
          coder:
            model: ./model
            port: 8081
            port: 8082
            method: kivi
          coder:
            model: ./model
            port: 9000
            method: fp16
        """
    assert issues(write_config(tmp_path, text)) == [
        (6, 5, "$.servers.coder.port", "duplicate key 'port' (first written at line 5)"),
        (8, 3, "$.servers.coder", "duplicate key 'coder' (first written at line 3)"),
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("version: 2\nservers: {}\n", (1, 10, "$.version", "unsupported version 2; this veloxd reads version 1")),
        ("version: '1'\nservers: {}\n", (1, 10, "$.version", "unsupported version '1'; this veloxd reads version 1")),
        ("servers: {}\n", (1, 1, "$.version", "missing required key 'version' (write 'version: 1')")),
    ],
)
def test_version(tmp_path: Path, text: str, expected: tuple) -> None:
    assert issue_in(tmp_path, text) == expected


def test_unreadable_paths_are_flagged_for_exit_2(tmp_path: Path) -> None:
    regular = write_config(tmp_path, VALID)
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # must not block: refused before it is opened
    cases = {
        tmp_path / "missing.yaml": "no such file",
        tmp_path: "is a directory, not a config file",
        fifo: "is not a regular file",
        regular / "below-a-file.yaml": "cannot read: Not a directory",
    }
    for path, message in cases.items():
        result = inspect_config(path)
        assert result.unreadable and result.config is None
        assert [(i.line, i.column, i.path, i.message) for i in result.issues] == [(1, 1, "$", message)]
        with pytest.raises(ConfigError) as caught:
            load_config(path)
        assert caught.value.unreadable


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_file_without_read_permission(tmp_path: Path) -> None:
    path = write_config(tmp_path, VALID)
    path.chmod(0o200)
    result = inspect_config(path)
    assert result.unreadable and "cannot read: Permission denied" in result.issues[0].message


@pytest.mark.parametrize(("mode", "who"), [(0o664, "its group"), (0o646, "others"), (0o666, "group and others")])
def test_writable_by_others_is_refused_with_the_other_errors(tmp_path: Path, mode: int, who: str) -> None:
    path = write_config(tmp_path, VALID.replace("port: 8082", "port: 0"))
    path.chmod(mode)
    found = issues(path)
    assert found[0][:3] == (1, 1, "$")
    assert f"refused: the file is writable by {who} (mode {mode:04o})" in found[0][3]
    assert "chmod go-w" in found[0][3]
    assert found[1] == (13, 11, "$.servers.chat.port", "port=0: must be >= 1")  # still reported


def test_world_writable_directory_is_refused_unless_sticky(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    path = write_config(shared, VALID)
    shared.chmod(0o777)
    [(_, _, _, message)] = issues(path)
    assert message.startswith(f"refused: its directory {shared} is writable by others")
    shared.chmod(0o1777)  # like /tmp: others cannot replace our file
    assert load_config(path).servers["coder"].port == 8081


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file away")
def test_file_owned_by_someone_else_is_refused(tmp_path: Path) -> None:
    path = write_config(tmp_path, VALID)
    os.chown(path, 4242, -1)
    assert only_issue(path)[3] == f"refused: the file belongs to uid 4242, not to you (uid {os.getuid()})"


def test_yaml_11_booleans_are_strings(tmp_path: Path) -> None:
    text = VALID + "    description: yes\n    allow_unauthenticated: on\n    env: {DEBUG: no}\n"
    assert issues(write_config(tmp_path, text, dedent=False)) == [
        (
            16,
            28,
            "$.servers.chat.allow_unauthenticated",
            "allow_unauthenticated must be true or false, not the string 'on' "
            "(veloxd reads YAML 1.2, where only true and false are booleans)",
        ),
    ]
    fixed = text.replace("allow_unauthenticated: on", "allow_unauthenticated: false")
    chat = load_config(write_config(tmp_path, fixed, dedent=False)).servers["chat"]
    assert chat.description == "yes" and chat.env == {"DEBUG": "no"}


@pytest.mark.parametrize(
    ("value", "line", "column", "message"),
    [
        ("!!python/object/apply:os.system ['true']", 16, 13, "unsupported tag '!!python/object/apply:os.system'"),
        ("!!binary aGVsbG8=", 16, 13, "unsupported tag '!!binary'"),
        ("!!int twelve", 16, 13, "'twelve' is not a valid int"),
        (".nan", 16, 13, "NaN is not allowed"),
    ],
)
def test_tags_and_nan(tmp_path: Path, value: str, line: int, column: int, message: str) -> None:
    text = VALID + f"    sampling:\n      temp: {value}\n"
    assert issue_in(tmp_path, text) == (line, column, "$.servers.chat.sampling.temp", message)


def test_complex_key(tmp_path: Path) -> None:
    text = "version: 1\nservers: {}\n? [a, b]\n: 1\n"
    assert issue_in(tmp_path, text) == (3, 3, "$", "a key must be a plain name, not a list or mapping")


def test_yaml_12_numbers(tmp_path: Path) -> None:
    text = VALID.replace("port: 8081", "port: 0x1F91").replace("port: 8082", "port: 08082")
    config = load_config(write_config(tmp_path, text, dedent=False))
    assert config.servers["coder"].port == 8081  # hexadecimal
    assert config.servers["chat"].port == 8082  # a leading zero is decimal in YAML 1.2, not octal


def test_mangled_files_never_raise(tmp_path: Path) -> None:
    """Random edits of a valid file: every outcome is a config or located one-line issues, never an exception."""
    import random

    rng = random.Random(7)
    source = (VALID + "    env: {A: b}\n    sampling: {temp: 0.5}\n    prompt_cache: {bytes: 2G}\n").encode()
    specials = [
        b":",
        b"-",
        b"[",
        b"]",
        b"{",
        b"}",
        b"&a",
        b"*a",
        b"!!",
        b"\t",
        b"\n",
        b" ",
        b"'",
        b'"',
        b"#",
        b"<<: *a",
        b"\xff",
        b"\x00",
        b"?",
        b"|",
        b">",
        b"%",
        b"@",
        b"`",
        b"---\n",
    ]
    outcomes = {"valid": 0, "invalid": 0}
    path = tmp_path / "veloxd.yaml"
    write_config(tmp_path, "")
    for _ in range(400):
        data = bytearray(source)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(data))
            if rng.random() < 0.5:
                data[at : at + rng.randint(1, 3)] = rng.choice(specials)
            else:
                del data[at : at + rng.randint(1, 8)]
        path.write_bytes(bytes(data))
        result = inspect_config(path)
        outcomes["valid" if result.config else "invalid"] += 1
        for issue in result.issues:
            assert issue.line >= 1 and issue.column >= 1 and "\n" not in issue.message and issue.path.startswith("$")
    assert outcomes["invalid"] > 200  # the edits really break things
