"""Read exported values back from /metrics text, for assertions in base units."""

from __future__ import annotations

from collections.abc import Iterable

from exporter.exposition import Family, render_text
from exporter.snapshot import FleetSnapshot
from exporter.sources.dcgm.exposition_parser import parse_text


class Exported:
    """The samples of one /metrics body, looked up by name and a subset of labels."""

    def __init__(self, text: str) -> None:
        parsed = parse_text(text)
        assert parsed.errors == 0, f"our own exposition did not parse: {parsed.first_error}"
        self.samples = parsed.samples
        self.text = text

    @classmethod
    def of(cls, snapshot: FleetSnapshot, extra: Iterable[Family] = ()) -> Exported:
        return cls(render_text(snapshot, extra=extra).decode())

    def all(self, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
        return [(lab, value) for n, lab, value in self.samples
                if n == name and all(lab.get(k, "") == v for k, v in labels.items())]

    def value(self, name: str, **labels: str) -> float:
        found = self.all(name, **labels)
        assert len(found) == 1, f"{name}{labels}: expected one series, found {found}"
        return found[0][1]

    def absent(self, name: str, **labels: str) -> bool:
        return not self.all(name, **labels)
