"""The text of series lines: label sets, HELP/TYPE headers, and the lines of a block of GPUs.

Every function writes exactly what ``prometheus_client.generate_latest`` writes for the
same samples (labels sorted by name, escaped, Go float values); tests/test_exposition.py
compares them byte for byte.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence
from operator import attrgetter

from exporter import metrics
from exporter.exposition.go_float import go_float, go_texts
from exporter.exposition.options import EVERY_FAMILY, ExpositionOptions
from exporter.metrics import Family, FamilySpec, Labels, Pairs
from exporter.snapshot import Gpu


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def label_text(labels: Labels, const: Labels = ()) -> str:
    """``{k="v",...}`` sorted by name, with ``const`` (the ``cluster`` label) merged in."""
    if const:
        labels = (*labels, *const)
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels))
    return "{" + inner + "}"


IDENTITY_KEY = attrgetter("node", "index", "uuid", "model", "pool")  # what identity() reads


def identity(gpu: Gpu) -> Labels:
    return (("gpu", str(gpu.index)), ("model", gpu.model), ("node", gpu.node),
            ("pool", gpu.pool), ("uuid", gpu.uuid))


def header(name: str, kind: str, help_text: str) -> str:
    escaped = help_text.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {escaped}\n# TYPE {name} {kind}\n"


class IdentitySplits:
    """One render's identity label pairs per GPU (``const`` merged in), joined once for each
    point at which a family's extra label falls in sorted order, and shared by every labelled
    family: a labelled series then costs one f-string, not a sort and an escape per label."""

    def __init__(self, gpus: Sequence[Gpu], const: Labels) -> None:
        self.gpus = gpus
        self.const = const
        self.names = sorted((*metrics.IDENTITY, *(k for k, _ in const)))
        self._pairs: list[list[str]] | None = None
        self._joined: dict[tuple[int, int], list[str]] = {}

    def joined(self, start: int, stop: int) -> list[str]:
        """Per GPU: its label pairs ``names[start:stop]``, comma-joined."""
        key = (start, stop)
        if key not in self._joined:
            if self._pairs is None:
                names = self.names
                self._pairs = []
                for gpu in self.gpus:
                    values = dict((*identity(gpu), *self.const))
                    self._pairs.append([f'{k}="{_escape(values[k])}"' for k in names])
            self._joined[key] = [",".join(pairs[start:stop]) for pairs in self._pairs]
        return self._joined[key]


class SplitsChunk(IdentitySplits):
    """GPUs ``start:stop`` of a render's :class:`IdentitySplits`: the block renderer renders a
    labelled family per chunk of GPUs, and the pairs are then built once for all chunks."""

    def __init__(self, whole: IdentitySplits, start: int, stop: int) -> None:
        super().__init__(whole.gpus[start:stop], whole.const)
        self.whole, self.start, self.stop = whole, start, stop

    def joined(self, start: int, stop: int) -> list[str]:
        return self.whole.joined(start, stop)[self.start:self.stop]


def render_labelled(spec: FamilySpec, samples_of_gpus: Sequence[Pairs],
                    splits: IdentitySplits) -> tuple[str, int]:
    """A labelled per-GPU family (``samples_of_gpus``: each GPU's pairs, those of ``splits``'
    GPUs in order): its text and series count. Each GPU's text around the extra
    label values is built once from ``splits``, the values are formatted together
    (:func:`go_texts`) and the lines joined in one call. The extra values are gpufleet's own
    words and numbers (reasons, causes, XID codes), never text read from a source, so they
    need no escaping."""
    extra = spec.labels[len(metrics.IDENTITY):]
    names = splits.names
    # where each extra label falls among the identity labels, in sorted order
    placed = sorted((bisect.bisect(names, label), label, i) for i, label in enumerate(extra))
    bounds = [0, *(p for p, _, _ in placed), len(names)]
    segments = [splits.joined(a, b) for a, b in itertools.pairwise(bounds)]
    labels = [label for _, label, _ in placed]
    order = [i for _, _, i in placed]
    prefixes: list[str] = []
    values: list[float] = []
    for g, samples in enumerate(samples_of_gpus):
        if not samples:
            continue
        # pieces[k] precedes the k-th extra value (sorted order); the last closes the braces
        pieces = []
        text, first = spec.name + "{", True
        for k, label in enumerate(labels):
            segment = segments[k][g]
            if segment:
                text += segment if first else "," + segment
                first = False
            text += f'{label}="' if first else f',{label}="'
            pieces.append(text)
            text, first = '"', False
        segment = segments[-1][g]
        pieces.append(f'{text},{segment}}} ' if segment else f"{text}}} ")
        if len(order) == 1:
            head, tail = pieces
            for extra_values, value in samples:
                prefixes.append(f"{head}{extra_values[0]}{tail}")
                values.append(value)
            continue
        for extra_values, value in samples:
            line = pieces[0]
            for k, i in enumerate(order):
                line += extra_values[i] + pieces[k + 1]
            prefixes.append(line)
            values.append(value)
    count = len(values)
    lines: list[str] = ["\n"] * (3 * count)  # prefix, value, "\n" per line: filled by slices
    lines[0::3] = prefixes
    lines[1::3] = go_texts(values)
    return "".join(lines), count


def render_families(families: Iterable[Family],
                    options: ExpositionOptions = EVERY_FAMILY) -> list[str]:
    out: list[str] = []
    const = options.const_labels
    for family in families:
        if not options.serves_name(family.name):
            continue
        out.append(header(family.name, family.type, family.help))
        for labels, value in family.samples:
            out.append(f"{family.name}{label_text(labels, const)} {go_float(float(value))}\n")
    return out


def value_lines(name: str, texts: list[str], values: list[float | None]) -> tuple[str, int]:
    """One line per GPU with a value, and their count; the value texts from :func:`go_texts`,
    the lines joined in one call."""
    if None in values:
        present = [(t, v) for t, v in zip(texts, values, strict=True) if v is not None]
        texts = [t for t, _ in present]
        values = [v for _, v in present]
    numbers = go_texts(values)  # type: ignore[arg-type]
    count = len(numbers)
    pieces = [name] * (5 * count)  # name, labels, " ", value, "\n" per line: filled by slices
    pieces[1::5] = texts
    pieces[2::5] = [" "] * count
    pieces[3::5] = numbers
    pieces[4::5] = ["\n"] * count
    return "".join(pieces), count
