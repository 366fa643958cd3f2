"""promtool's unit tests over only the rule groups each test file can see.

promtool evaluates every group of the rule files a test file names at every step of each of
its tests, so one file about one alert paid for all of them (the 24-hour load statistics
above all): about 30 CPU s for rules/tests, against about 4 s when each file gets only the
groups it can see. A test sees a group's results only through the names that group writes
(its alerts' and recording rules' names), or through ALERTS / ALERTS_FOR_STATE, which hold
every alert: so a file keeps each group whose written name it spells, then each group whose
written name a kept group spells (a recording rule an alert reads), and it keeps every group
when it, or a kept group, spells ALERTS or __name__ (a name picked by pattern). Spelling is
read from the text, comments included, so a doubt keeps a group. promtool orders the groups
of a test as it likes (without group_eval_order, which no test file here sets), so the groups
left out changed nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

RULE_FILES = ("gpufleet-recording.yaml", "gpufleet-alerts.yaml")
# every alert, or series picked by name pattern ({__name__=~"job:.*"}): any group may be read
_READS_ANY = re.compile(r"(?<![\w:])(?:ALERTS|ALERTS_FOR_STATE|__name__)(?![\w:])")


@dataclass(frozen=True)
class Group:
    file: str  # one of RULE_FILES
    name: str
    writes: frozenset[str]  # its alerts' and recording rules' names
    text: str  # everything it spells: exprs, labels, annotations (their queries)
    body: dict


def rule_groups(rules_dir: Path) -> list[Group]:
    out = []
    for file in RULE_FILES:
        for body in yaml.safe_load((rules_dir / file).read_text())["groups"]:
            writes = frozenset(r.get("alert") or r["record"] for r in body["rules"])
            out.append(Group(file, body["name"], writes, yaml.safe_dump(body), body))
    return out


def spelled(text: str) -> set[str]:
    """Every word of TEXT a series or alert name could be: the runs of letters, digits, _
    and : (so job:y:sum is not spelled by job:y:sum_mean1h)."""
    return set(re.findall(r"[\w:]+", text))


def groups_seen(test_text: str, groups: list[Group]) -> list[Group]:
    """The groups whose results a unit-test file can read, in their files' order."""
    written = set().union(*(g.writes for g in groups))
    kept: set[int] = set()
    texts = [test_text]
    while texts:
        read = written & set().union(*(spelled(text) for text in texts))
        new = [i for i, g in enumerate(groups) if i not in kept and g.writes & read]
        kept.update(new)
        texts = [groups[i].text for i in new]
    if _READS_ANY.search(test_text) or any(_READS_ANY.search(groups[i].text) for i in kept):
        return list(groups)
    return [g for i, g in enumerate(groups) if i in kept]


def unit_tests_on_groups_seen(rules_dir: Path, tests: list[Path], out: Path) -> list[Path]:
    """Each test file copied, byte for byte, to OUT/<its stem>/tests/, beside the two rule
    files cut to the groups it sees; the copies' paths, for one `promtool test rules`. The
    copies keep their names, so promtool's "Unit Testing: .../<name>" names the file."""
    groups = rule_groups(rules_dir)
    copies = []
    for test in tests:
        text = test.read_text()
        seen = groups_seen(text, groups)
        home = out / test.stem
        (home / "tests").mkdir(parents=True)
        for file in RULE_FILES:
            kept = [g.body for g in seen if g.file == file]
            (home / file).write_text(yaml.safe_dump({"groups": kept}, sort_keys=False))
        copy = home / "tests" / test.name
        copy.write_text(text)
        copies.append(copy)
    return copies
