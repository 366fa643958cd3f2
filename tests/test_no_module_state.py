"""No module-level mutable state under exporter/advisor/.

State kept at module level is shared by every advisor, planner, what-if and thread in the
process, and outlives them: the advisor's state belongs to the objects the serving cycle
and the simulator hold. Every module of the package is imported and each of its
module-level names must hold something immutable by construction; a name that does not is
listed with its module and type.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import datetime
import enum
import functools
import importlib
import logging
import pkgutil
import re
import types
import typing
from collections import Counter, deque

import pytest

import exporter.advisor

# Types whose instances are immutable by construction (or are code, not state).
IMMUTABLE_TYPES: tuple[type, ...] = (
    type(None), bool, int, float, complex, str, bytes, range, type(Ellipsis), type(NotImplemented),
    types.FunctionType, types.BuiltinFunctionType, types.MethodWrapperType,
    type,  # classes: their class attributes are checked as if a module's (see class_state)
    re.Pattern,  # a compiled regular expression has no setter
    datetime.timezone, datetime.date, datetime.time, datetime.timedelta,  # value types
    type(annotations),  # what `from __future__ import annotations` binds: the compiler's flag
    enum.Enum,  # members are singletons with read-only values
)

# Objects of the typing machinery: aliases (Callable[...], Literal[...], X | None), TypeVars.
TYPING_MODULES = frozenset({"typing", "typing_extensions", "collections.abc", "_collections_abc"})
TYPING_TYPES = (types.GenericAlias, types.UnionType)  # list[int], int | None


def is_cached_function(value: object) -> bool:
    """A functools.cache/lru_cache of a module function: its memo is keyed by the arguments'
    values, so what it answers never depends on what was asked before."""
    return isinstance(value, functools._lru_cache_wrapper) and isinstance(  # type: ignore[attr-defined]
        value.__wrapped__, types.FunctionType)


def is_logger(value: object) -> bool:
    """A logging.Logger: its configuration is the logging module's, shared by design."""
    return isinstance(value, logging.Logger)


def is_app_key(value: object) -> bool:
    """An aiohttp AppKey: a name and a type, used as a dict key; never changed."""
    return type(value).__name__ == "AppKey" and type(value).__module__.startswith("aiohttp")


def why_mutable(value: object, depth: int = 0) -> str | None:
    """None when ``value`` is immutable by construction, else what makes it mutable."""
    if depth > 8:
        return "nested too deep to check"
    if isinstance(value, (dict, list, set, bytearray, deque, Counter)):
        return type(value).__name__
    if isinstance(value, IMMUTABLE_TYPES) or is_cached_function(value) or is_logger(value) \
            or is_app_key(value):
        return None
    if isinstance(value, types.MappingProxyType):
        # a read-only view of a dict made for it and held by nothing else: immutable when
        # what it maps is
        for key, item in value.items():
            if (why := why_mutable(key, depth + 1) or why_mutable(item, depth + 1)) is not None:
                return f"mappingproxy holding {why}"
        return None
    if type(value).__module__ in TYPING_MODULES or isinstance(value, TYPING_TYPES):
        return None  # a type alias or TypeVar: annotations, not state
    if isinstance(value, (tuple, frozenset)):
        for item in value:
            if (why := why_mutable(item, depth + 1)) is not None:
                return f"{type(value).__name__} holding {why}"
        return None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if not type(value).__dataclass_params__.frozen:  # type: ignore[attr-defined]
            return f"a {type(value).__name__} (a dataclass that is not frozen)"
        for f in dataclasses.fields(value):
            if (why := why_mutable(getattr(value, f.name), depth + 1)) is not None:
                return f"a frozen {type(value).__name__} whose {f.name} is {why}"
        return None
    config = getattr(type(value), "__struct_config__", None)  # a msgspec Struct
    if config is not None:
        if not config.frozen:
            return f"a {type(value).__name__} (a Struct that is not frozen)"
        for name in type(value).__struct_fields__:  # type: ignore[attr-defined]
            if (why := why_mutable(getattr(value, name), depth + 1)) is not None:
                return f"a frozen {type(value).__name__} whose {name} is {why}"
        return None
    return f"an instance of {type(value).__module__}.{type(value).__qualname__}"


# Module-level names allowed although why_mutable() finds them mutable: (module, name) -> why.
# Empty today; an entry must say why the object is immutable by construction.
ALLOWED: dict[tuple[str, str], str] = {}


def advisor_modules() -> list[str]:
    found = [exporter.advisor.__name__]
    found += [m.name for m in pkgutil.walk_packages(exporter.advisor.__path__, "exporter.advisor.")]
    return sorted(found)


def module_state(module: types.ModuleType) -> list[str]:
    """Each module-level name of ``module`` holding mutable state, as 'name: why'."""
    found = []
    for name, value in sorted(vars(module).items()):
        if name.startswith("__") and name.endswith("__"):
            continue  # the interpreter's own (__dict__ of the module, __path__, __builtins__)
        if isinstance(value, types.ModuleType) or (module.__name__, name) in ALLOWED:
            continue
        why = why_mutable(value)
        if why is None and isinstance(value, type) and value.__module__ == module.__name__:
            why = class_state(value)
        if why is not None:
            found.append(f"{name}: {why}")
    return found


def class_state(cls: type) -> str | None:
    """A class attribute holding mutable state is module state too: every instance shares it.
    Methods, properties, descriptors and dataclass fields' defaults made per instance are not."""
    for name, value in vars(cls).items():
        if name.startswith("__") and name.endswith("__"):
            continue
        if isinstance(value, (staticmethod, classmethod, property, types.MemberDescriptorType,
                              types.GetSetDescriptorType, functools.cached_property)):
            continue
        if (why := why_mutable(value)) is not None:
            return f"class attribute {name} is {why}"
    return None


@pytest.mark.parametrize("name", advisor_modules())
def test_no_module_level_mutable_state(name: str) -> None:
    module = importlib.import_module(name)
    assert module_state(module) == [], f"{name} keeps state at module level"


def test_the_modules_are_all_found() -> None:
    found = advisor_modules()
    assert {"exporter.advisor.planner", "exporter.advisor.engine", "exporter.advisor.advise",
            "exporter.advisor.service", "exporter.advisor.api"} <= set(found)


def test_the_check_finds_each_kind_of_mutable_state() -> None:
    """The check itself: each kind of mutable module-level object is found, and the
    immutable kinds pass."""
    import threading

    @dataclasses.dataclass(frozen=True)
    class Frozen:
        items: tuple[int, ...] = ()

    @dataclasses.dataclass
    class Plain:
        x: int = 0

    class Kept:
        def __init__(self) -> None:
            self.placer = None

    class Shared:
        registry: typing.ClassVar[dict[str, int]] = {}  # every instance's: module state

    class Fine:
        names = ("a", "b")

        def method(self) -> None:
            pass

    Shared.__module__ = Fine.__module__ = "fake"
    fake = types.ModuleType("fake")
    fake.__dict__.update(
        ok_tuple=(1, "a", (2.0, None)), ok_frozen=Frozen((1,)), ok_frozenset=frozenset({1}),
        ok_function=len, ok_pattern=re.compile("x"), ok_logger=logging.getLogger("x"),
        ok_alias=typing.Callable[[int], str], ok_union=int | None, ok_generic=list[int],
        ok_typevar=typing.TypeVar("T"), ok_literal=typing.Literal["a"],
        ok_cached=functools.cache(lambda: 1), ok_proxy=types.MappingProxyType({"a": (1,)}),
        ok_abc_alias=collections.abc.Callable[[int], str], ok_zone=datetime.UTC,
        bad_list=[], bad_dict={}, bad_set=set(), bad_counter=Counter(), bad_deque=deque(),
        bad_bytearray=bytearray(), bad_lock=threading.Lock(), bad_kept=Kept(), bad_plain=Plain(),
        bad_tuple=([],), bad_frozen=Frozen(([],)),  # type: ignore[arg-type]
        bad_proxy=types.MappingProxyType({"a": []}), bad_namespace=types.SimpleNamespace(),
        bad_partial=functools.partial(print, sep=""), bad_class_attribute=Shared, ok_class=Fine,
    )
    found = {line.split(":")[0] for line in module_state(fake)}
    assert found == {name for name in vars(fake) if name.startswith("bad_")}
