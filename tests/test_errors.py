"""The user-facing errors and the one-line rule their messages keep."""

from __future__ import annotations

import pytest

from exporter.errors import one_line


@pytest.mark.parametrize("brk", ["\n", "\r", "\r\n", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85",
                                 "\u2028", "\u2029"])
def test_one_line_escapes_every_line_break(brk):
    text = one_line(f"t.yaml: alerts[0].labels.a{brk}b: not a valid label name")
    assert len(text.splitlines()) == 1
    assert text == f"t.yaml: alerts[0].labels.a{repr(brk)[1:-1]}b: not a valid label name"


def test_one_line_leaves_other_text_alone():
    assert one_line("f.yaml: a\tb: café") == "f.yaml: a\tb: café"
