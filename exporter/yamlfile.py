"""The one YAML reader: every YAML file gpufleet reads fails the same way, on one line.

The config file, the threshold table, the GPU catalogue and dcgm's targets file
come through here. A message names the file, then what a user needs to find the
fault: the line (and column) of a syntax error with the key it sits under, the
key given twice (plain PyYAML keeps the last silently, so a config could set a
value and override it lower down), or what the top level is when it should be
a mapping::

    gpufleet.yaml: cannot read config file: No such file or directory
    gpufleet.yaml: not UTF-8 at line 3 (byte 0xE9)
    gpufleet.yaml: not valid YAML at line 4, column 5 (in sources.sim): mapping values are not allowed here
    gpufleet.yaml: sources.sim.seed: given twice, at lines 3 and 9; keep one
    gpufleet.yaml: top level: must be a mapping, got a list at line 1
    gpufleet.yaml: listen[5][0]: aliases expand to more than 100,000 values; write the values out

The last is the billion laughs: nine levels of nine aliases are 9**9 values to
whoever walks or prints the document, from a file of 600 bytes. Anchors and
aliases stay (``<<: *base`` is how a config shares a pool's settings), but what
the aliases add is counted against a budget, as go-yaml does ("document
contains excessive aliasing"), and an alias inside its own anchor is refused.

Each caller picks the exception class (ConfigError, ThresholdError, or the
ValueError a source reports), so the CLI still prints it on one line and exits 2.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml
from yaml.reader import ReaderError

from exporter.bounded_file import Wording, read_bounded
from exporter.errors import ConfigError, one_line

_MERGE = "tag:yaml.org,2002:merge"  # "<<: *base" may repeat: it is no key of the mapping
_INT = "tag:yaml.org,2002:int"
# Values aliases may add: a file_sd targets file sharing one labels mapping across 10,000
# targets adds 30,000; the billion laughs passes it at its sixth level of nine.
ALIAS_BUDGET = 100_000
# bytes of any YAML file read: a config, a kubeconfig, a threshold table or a dcgm targets
# file of 10,000 targets is well under 2 MB
MAX_FILE_BYTES = 16 * 2 ** 20
_KINDS = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "true or false"}


def read_text(path: str | Path, what: str, error: type[Exception] = ConfigError,
              limit: int = MAX_FILE_BYTES) -> str:
    """The file's text; ``error`` naming the file if it cannot be read, is over ``limit``
    bytes (``/dev/zero`` or a 10 GB log named by mistake: refused, not read whole; a regular
    file by its size, before a byte is read) or is not UTF-8."""
    wording = Wording(error, cannot_read="{path}: cannot read {what}: {reason}",
                      over_limit="{path}: {size} bytes, over the {limit}-byte limit for {what}",
                      grew_over_limit="{path}: over the {limit}-byte limit for {what}")
    data = read_bounded(path, limit, wording, what=what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise error(f"{path}: not UTF-8 at line {line} (byte 0x{data[exc.start]:02X})") from None


def parse(text: str, source: str, error: type[Exception] = ConfigError) -> Any:
    """One YAML document (None when empty), read safely; ``error`` on any fault, naming ``source``."""
    return _parse(text, source, error)[0]


def parse_mapping(text: str, source: str, error: type[Exception] = ConfigError,
                  empty_ok: bool = False) -> dict[Any, Any]:
    """A document whose top level is a mapping; an empty one is ``{}`` when ``empty_ok``."""
    data, node = _parse(text, source, error)
    if node is None:
        if empty_ok:
            return {}
        raise error(f"{source}: top level: must be a mapping, got an empty file")
    if not isinstance(data, dict):
        kind = _KINDS.get(type(data), type(data).__name__)
        raise error(f"{source}: top level: must be a mapping, got {kind} "
                    f"at line {node.start_mark.line + 1}")
    return data


def load_mapping(path: str | Path, what: str, error: type[Exception] = ConfigError,
                 empty_ok: bool = False) -> dict[Any, Any]:
    """:func:`read_text` then :func:`parse_mapping`, naming the file as given."""
    return parse_mapping(read_text(path, what, error), str(path), error, empty_ok)


# libyaml's parser, where PyYAML was built with it: the threshold table (22 KB) composes in
# a tenth of the time. It composes the same nodes with the same marks, but words its errors
# its own way and reads characters the pure reader refuses, so it only takes a document the
# pure reader's character check passes, and any error is found again by the pure loader,
# whose message (line, column, the key above) is the one users see. libyaml bounds nesting
# itself (1,000 levels), so a "[" * 10**6 bomb is an error there too, not a C stack overflow.
_FAST_LOADER: Any = getattr(yaml, "CSafeLoader", None)
_NON_PRINTABLE = yaml.reader.Reader.NON_PRINTABLE


def _parse(text: str, source: str, error: type[Exception]) -> tuple[Any, yaml.Node | None]:
    if _FAST_LOADER is not None and _NON_PRINTABLE.search(text) is None:
        try:
            return _parse_with(_FAST_LOADER(text), source, error)
        except yaml.YAMLError:
            pass  # the pure loader finds it again, and words it as users see it
    try:
        return _parse_with(yaml.SafeLoader(text), source, error)  # control characters: ReaderError
    except yaml.YAMLError as exc:
        raise error(one_line(_syntax(exc, text, source))) from None


def _parse_with(loader: Any, source: str, error: type[Exception]) -> tuple[Any, yaml.Node | None]:
    """Compose, walk (:class:`_Walk`), construct; a YAMLError is the caller's to word."""
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        _Walk(source, error).node(node, "")
        return loader.construct_document(node), node
    except RecursionError:  # PyYAML composes and constructs recursively: "[" * 5000
        raise error(f"{source}: nested too deeply") from None
    finally:
        loader.dispose()


class _Walk:
    """One pass over the composed nodes, before anything is constructed: a key given twice
    in one mapping, aliases past :data:`ALIAS_BUDGET`, an alias inside its own anchor, and an
    integer too long for ``int()`` are each refused, naming the key."""

    def __init__(self, source: str, error: type[Exception]) -> None:
        self.source, self.error = source, error
        self.seen: set[int] = set()
        self.open: set[int] = set()  # the nodes the walk is inside
        self.sizes: dict[int, int] = {}  # values a node stands for, aliases expanded
        self.aliased = 0

    def fail(self, path: str, problem: str) -> Exception:
        return self.error(one_line(f"{self.source}: {path or 'top level'}: {problem}"))

    def node(self, node: yaml.Node, path: str) -> None:
        if id(node) in self.open:
            raise self.fail(path, "an alias inside its own anchor")
        if id(node) in self.seen:  # an alias: checked where the anchor is; counted here
            self.aliased += self.size(node)
            if self.aliased > ALIAS_BUDGET:
                raise self.fail(path, f"aliases expand to more than {ALIAS_BUDGET:,} values; "
                                "write the values out")
            return
        self.seen.add(id(node))
        self.open.add(id(node))
        if isinstance(node, yaml.MappingNode):
            self.mapping(node, path)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                self.node(item, f"{path}[{index}]")
        elif node.tag == _INT and len(node.value) > sys.get_int_max_str_digits() > 0:
            raise self.fail(path, f"a number of {len(node.value):,} digits; at most "
                            f"{sys.get_int_max_str_digits():,}")
        self.open.discard(id(node))

    def mapping(self, node: yaml.MappingNode, path: str) -> None:
        """Refuse a key given twice in one mapping, naming it and both lines."""
        first: dict[tuple[str, str], int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE:
                name = "<<"
            elif isinstance(key_node, yaml.ScalarNode):
                name = key_node.value
                line = key_node.start_mark.line + 1
                if (key_node.tag, name) in first:
                    raise self.fail(_join(path, name), f"given twice, at lines "
                                    f"{first[key_node.tag, name]} and {line}; keep one")
                first[key_node.tag, name] = line
            else:
                name = "?"  # a complex key (a list or mapping): no user of ours writes one
            self.node(value_node, _join(path, name))

    def size(self, node: yaml.Node) -> int:
        """Values ``node`` stands for once its aliases are expanded (it is walked already, so
        it contains no alias of itself); memoised, so shared levels are counted once."""
        known = self.sizes.get(id(node))
        if known is None:
            if isinstance(node, yaml.MappingNode):
                known = 1 + sum(self.size(k) + self.size(v) for k, v in node.value)
            elif isinstance(node, yaml.SequenceNode):
                known = 1 + sum(self.size(item) for item in node.value)
            else:
                known = 1
            self.sizes[id(node)] = known
        return known


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _syntax(exc: yaml.YAMLError, text: str, source: str) -> str:
    """One line for a YAML fault: where it is, the key it sits under, what PyYAML says."""
    if isinstance(exc, ReaderError):  # a control character, before any parsing
        line = text.count("\n", 0, exc.position) + 1
        return f"{source}: not valid YAML at line {line}: {exc.reason} (#x{exc.character:04x})"
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or ""
    context = getattr(exc, "context", None) or ""
    if problem.startswith("but ") and context:  # "expected a single document ..., but found ..."
        problem = f"{context}, {problem}"
    problem = " ".join((problem or context or "cannot be parsed").split())
    if mark is None:
        return f"{source}: not valid YAML: {problem}"
    key = _key_at(text, mark.index)
    under = f" (in {key})" if key else ""
    return (f"{source}: not valid YAML at line {mark.line + 1}, column {mark.column + 1}{under}: "
            f"{problem}")


def _key_at(text: str, index: int) -> str:
    """The dotted key being read when the parser reached ``index`` (or failed before it).

    Walks PyYAML's events with a stack of open mappings and sequences; only runs
    for a file that has already failed, so a good file is parsed once.
    """
    stack: list[dict[str, Any]] = []  # {"seq": index} or {"key": ..., "in_value": bool}
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.NodeEvent):
                if event.start_mark is not None and event.start_mark.index > index:
                    break
                parent = stack[-1] if stack else None
                if parent is not None and "seq" in parent:
                    parent["seq"] += 1
                elif parent is not None and not parent["in_value"]:  # the node is a key
                    parent["next"] = event.value if isinstance(event, yaml.ScalarEvent) else "?"
                if isinstance(event, yaml.MappingStartEvent):
                    stack.append({"key": None, "in_value": False})
                elif isinstance(event, yaml.SequenceStartEvent):
                    stack.append({"seq": -1})
                elif event.end_mark is not None and event.end_mark.index > index:  # fault inside it
                    break
                else:
                    _done(parent)
            elif isinstance(event, yaml.CollectionEndEvent):
                stack.pop()
                _done(stack[-1] if stack else None)
    except yaml.YAMLError:
        pass  # the fault itself: the stack is where the parser was
    parts = []
    for frame in stack:
        if "seq" in frame and frame["seq"] >= 0:
            parts.append(f"[{frame['seq']}]")
        elif "key" in frame and frame["in_value"]:
            parts.append(("." if parts else "") + str(frame["key"]))
    return "".join(parts)


def _done(frame: dict[str, Any] | None) -> None:
    """A node ended inside ``frame``: in a mapping, a key's value comes next, or the next key."""
    if frame is None or "key" not in frame:
        return
    if frame["in_value"]:
        frame["in_value"] = False
    else:
        frame["key"], frame["in_value"] = frame.pop("next"), True


__all__ = ["load_mapping", "parse", "parse_mapping", "read_text"]
