"""The one YAML reader: each fault is one line naming the file, the line and the key."""

from __future__ import annotations

import pytest

from exporter.errors import ConfigError
from exporter.yamlfile import load_mapping, parse, parse_mapping, read_text


@pytest.mark.parametrize(("text", "message"), [
    ("sources: [unclosed\n",
     "f.yaml: not valid YAML at line 2, column 1 (in sources[0]): expected ',' or ']', "
     "but got '<stream end>'"),
    ("sources:\n  sim:\n    seed: 1\n    speed: 2: 3\n",
     "f.yaml: not valid YAML at line 4, column 13 (in sources.sim): "
     "mapping values are not allowed here"),
    ("a: 1\nb:\n  - x\n  - y: [1, 2\n",
     "f.yaml: not valid YAML at line 5, column 1 (in b[1].y[1]): expected ',' or ']', "
     "but got '<stream end>'"),
    ("a: 1\nb:\n  c: !foo x\n",
     "f.yaml: not valid YAML at line 3, column 6 (in b.c): could not determine a constructor "
     "for the tag '!foo'"),
    ("x: *nope\n", "f.yaml: not valid YAML at line 1, column 4 (in x): found undefined alias 'nope'"),
    ("a: 1\n---\nb: 2\n", "f.yaml: not valid YAML at line 2, column 1: expected a single document "
                          "in the stream, but found another document"),
    ("a: \x07\n", "f.yaml: not valid YAML at line 1: special characters are not allowed (#x0007)"),
    ("a: 1\na: 2\n", "f.yaml: a: given twice, at lines 1 and 2; keep one"),
    ("s:\n  sim:\n    seed: 1\n    x: 2\n    seed: 3\n",
     "f.yaml: s.sim.seed: given twice, at lines 3 and 5; keep one"),
    ("l:\n  - {k: 1, k: 2}\n", "f.yaml: l[0].k: given twice, at lines 2 and 2; keep one"),
    ('"a\\nb": 1\n"a\\nb": 2\n', "f.yaml: a\\nb: given twice, at lines 1 and 2; keep one"),
    ("# a comment\n\n- 1\n", "f.yaml: top level: must be a mapping, got a list at line 3"),
    ("just text\n", "f.yaml: top level: must be a mapping, got a string at line 1"),
    ("", "f.yaml: top level: must be a mapping, got an empty file"),
])
def test_each_fault_is_one_line_naming_the_file_line_and_key(text, message):
    with pytest.raises(ConfigError) as info:
        parse_mapping(text, "f.yaml")
    assert str(info.value) == message


def test_good_documents_read_as_safe_load_does():
    assert parse_mapping("a: 1\nb: [x, {c: 2}]\n", "f.yaml") == {"a": 1, "b": ["x", {"c": 2}]}
    assert parse_mapping("# nothing\n", "f.yaml", empty_ok=True) == {}
    assert parse("- 1\n- 2\n", "f.yaml") == [1, 2]  # file_sd target lists are lists
    assert parse("", "f.yaml") is None
    # merge keys may repeat, and an alias is checked once, where its anchor is
    text = "base: &b {x: 1}\nother:\n  <<: *b\n  <<: *b\n  y: 2\nthird: *b\n"
    assert parse_mapping(text, "f.yaml")["other"] == {"x": 1, "y": 2}
    # the same spelling with another tag is another key
    assert parse_mapping("1: a\n'1': b\n", "f.yaml") == {1: "a", "1": "b"}


def test_the_caller_chooses_the_exception():
    with pytest.raises(ValueError, match=r"^f.yaml: a: given twice"):
        parse("a: 1\na: 2\n", "f.yaml", ValueError)


def test_unreadable_and_non_utf8_files(tmp_path):
    with pytest.raises(ConfigError) as info:
        read_text(tmp_path / "nope.yaml", "config file")
    assert str(info.value) == f"{tmp_path / 'nope.yaml'}: cannot read config file: No such file or directory"
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"a: 1\n# caf\xe9\n")
    with pytest.raises(ConfigError) as info:
        load_mapping(latin, "config file")
    assert str(info.value) == f"{latin}: not UTF-8 at line 2 (byte 0xE9)"
    good = tmp_path / "good.yaml"
    good.write_text("a: 1\n")
    assert load_mapping(good, "config file") == {"a": 1}


def _laughs(levels: int) -> str:
    """The billion laughs: level i is a list of nine aliases of level i - 1."""
    lines = ["listen:", "  - &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"  - &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def test_alias_expansion_is_bounded():
    """9**9 strings behind 100 aliases: refused where the aliases pass 100,000 values, before
    anyone walks or formats the value; a few levels of it are fine."""
    assert len(parse_mapping(_laughs(3), "f.yaml")["listen"][3]) == 9
    with pytest.raises(ConfigError) as info:
        parse_mapping(_laughs(9), "f.yaml")
    assert str(info.value) == ("f.yaml: listen[5][0]: aliases expand to more than 100,000 values; "
                               "write the values out")


def test_a_node_that_contains_itself_is_refused():
    with pytest.raises(ConfigError) as info:
        parse_mapping("a: &x [1, *x]\n", "f.yaml")
    assert str(info.value) == "f.yaml: a[1]: an alias inside its own anchor"
    with pytest.raises(ConfigError, match=r"^f.yaml: b.c: an alias inside its own anchor$"):
        parse_mapping("b: &m {c: *m}\n", "f.yaml")


def test_deep_nesting_is_one_line():
    with pytest.raises(ConfigError) as info:
        parse_mapping("a: " + "[" * 5000 + "]" * 5000 + "\n", "f.yaml")
    assert str(info.value) == "f.yaml: nested too deeply"


def test_an_integer_too_long_for_int_is_one_line():
    """PyYAML's int() raised a ValueError no caller catches: exit 1, not 2."""
    with pytest.raises(ConfigError) as info:
        parse_mapping("a:\n  b: " + "1" * 5000 + "\n", "f.yaml")
    assert str(info.value) == "f.yaml: a.b: a number of 5,000 digits; at most 4,300"
    assert parse_mapping("a: " + "1" * 4300 + "\n", "f.yaml")["a"] == int("1" * 4300)
