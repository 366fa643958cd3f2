"""exporter/validate.py: the one validator, its records and its checks name the key."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from exporter import validate
from exporter.errors import ConfigError


@dataclass(frozen=True)
class Inner:
    size: int
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Outer:
    name: str
    inner: Inner | None = None
    items: tuple[Inner, ...] = ()


def _leaf(tp, value, key, meta):
    if not isinstance(value, tp):
        raise ConfigError(f"{key}: must be {tp.__name__}, got {value!r}")
    return value


BUILDER = validate.Builder(_leaf, ConfigError)


def test_a_record_is_built_by_its_field_types():
    built = BUILDER.build(Outer, {"name": "n", "inner": {"size": 1, "tags": ["a", "b"]},
                                  "items": [{"size": 2}]})
    assert built == Outer("n", Inner(1, ("a", "b")), (Inner(2),))
    assert BUILDER.build(Outer, {"name": "n", "inner": None}).inner is None


@pytest.mark.parametrize(("data", "message"), [
    ({"name": "n", "items": [{"size": 1}, {"size": "x"}]}, "items[1].size: must be int, got 'x'"),
    ({"name": "n", "inner": {"size": 1, "tags": ["a", 2]}}, "inner.tags[1]: must be str, got 2"),
    ({"name": "n", "inner": {"sise": 1}}, "inner.sise: unknown key (allowed: size, tags)"),
    ({"name": "n", "items": [{}]}, "items[0].size: required"),
    ({"name": "n", "inner": [1]}, "inner: must be a mapping, got list"),
    ({"name": "n", "items": {"size": 1}}, "items: must be a list, got dict"),
    ({"inner": {"size": 1}}, "name: required"),
])
def test_every_fault_names_its_key(data, message):
    with pytest.raises(ConfigError) as info:
        BUILDER.build(Outer, data)
    assert str(info.value) == message


def test_an_unknown_key_is_named_before_any_value_is_checked():
    with pytest.raises(ConfigError, match=r"^typo: unknown key"):
        BUILDER.build(Outer, {"name": 5, "typo": 1})


def test_the_caller_words_an_unknown_key():
    builder = validate.Builder(_leaf, ValueError, unknown="{record}: unknown field {name} (at {where})")
    with pytest.raises(ValueError) as info:
        builder.build(Outer, {"name": "n", "inner": {"size": 1, "colour": 2}})
    assert str(info.value) == "Inner: unknown field 'colour' (at inner.colour)"


def test_file_checks_word_as_the_config_does():
    with pytest.raises(ConfigError) as info:
        validate.one_of("TLS14", "tls.min_version", ("TLS12", "TLS13"))
    assert str(info.value) == "tls.min_version: must be one of TLS12, TLS13, got 'TLS14'"
    with pytest.raises(ConfigError) as info:
        validate.mapping({"a": 1, "b": 2}, "top", ("a",))
    assert str(info.value) == "top.b: unknown key (allowed: a)"
    assert validate.mapping({1: "x"}, "top", None) == {"1": "x"}  # a scalar key is text
    assert validate.text(True, "k", scalars=True) == "true"
    with pytest.raises(ConfigError, match=r"^k: must be true or false, got 'yes'$"):
        validate.true_or_false("yes", "k")


def test_a_json_check_and_its_schema_share_the_numbers():
    check = validate.array(validate.integer(0, 64), 2)
    assert validate.json_schema(check) == {
        "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 64}, "maxItems": 2}
    with pytest.raises(validate.Invalid) as info:
        check([1, 65], "gpus")
    assert str(info.value) == "gpus[1]: must be an integer from 0 to 64, got 65"
