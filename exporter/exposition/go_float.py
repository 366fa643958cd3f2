"""Go's text of a float, as Prometheus' client libraries write sample values.

``prometheus_client.utils.floatToGoString`` is the reference (a test compares
every path here with it on random bit patterns and every decade); this module
makes the same text faster, one value (:func:`go_float`) or a block of them in C
(:func:`go_texts`), because formatting values is most of a render's time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec
from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    import numpy as np

_INF = float("inf")


def go_float(value: float) -> str:
    # repr() already matches Go below 1e6; floatToGoString handles the exponent switch,
    # infinities and NaN. Skipping the call for the common case halves render time.
    if -1e6 < value < 1e6:
        return repr(value)
    if 1e6 <= value < _INF:  # floatToGoString's positive finite case, inlined: counters
        text = repr(value)  # and byte sizes are most of the values this large
        dot = text.find(".")
        if dot > 6:
            mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
            return f"{mantissa}e+{dot - 1:02d}"
        return text
    return floatToGoString(value)


_encode_json = msgspec.json.Encoder().encode
_EXPONENTS = tuple(f"e+{k:02d}" for k in range(17))
# below this many values a block is formatted one value at a time (about 0.3 ms at most): a
# node's blocks (8 GPUs, 18 NVLink links each: 144 values) need no numpy, whose import is
# 17 MB of a node's memory (docs/performance.md, "A lean node")
SMALL_BLOCK = 1024


def go_texts(values: Sequence[float]) -> list[str]:
    """Go's text of each value, exactly as :func:`go_float` gives it, made in C for a block.

    Formatting a float is most of a render's time (7 families change for every GPU every
    snapshot), and ``repr`` per value costs a Python call each. msgspec writes the shortest
    round-trip digits, as ``repr`` does, for a whole list at once; where ``repr`` writes
    positional notation (``1e-4 <= |v| < 1e16``) the two texts are the same, and Go's is
    ``repr``'s below 1e6. Whole numbers from 1e6 to 1e15 (byte counters, capacities) take
    :func:`_exponent_texts`; the rest (tiny, negative or fractional large values, NaN,
    infinities) :func:`go_float`. tests/test_exposition.py compares all three with
    client_python's on random bit patterns and every decade.
    """
    if len(values) < SMALL_BLOCK:
        return [go_float(float(v)) for v in values]
    import numpy as np

    floats = np.array(values, dtype=np.float64)
    magnitude = np.abs(floats)
    plain = (magnitude < 1e6) & ((magnitude >= 1e-4) | (floats == 0))
    if plain.all():
        return _encode_json(floats.tolist())[1:-1].decode().split(",")
    out = np.empty(len(floats), dtype=object)
    if plain.any():
        out[plain] = _encode_json(floats[plain].tolist())[1:-1].decode().split(",")
    whole = ~plain & (floats >= 1e6) & (floats < 1e15)
    candidates = np.where(whole, floats, 0.0)
    whole &= np.floor(candidates) == candidates
    if whole.any():
        out[whole] = _exponent_texts(floats[whole])
    for i in np.flatnonzero(~plain & ~whole).tolist():
        out[i] = go_float(float(floats[i]))
    return out.tolist()  # type: ignore[no-any-return]


def _exponent_texts(numbers: np.ndarray) -> np.ndarray:
    """Go's text of whole numbers from 1e6 to 1e15: the shortest digits as ``d.ddd`` and the
    exponent. ``number / 10**exponent`` is the double nearest a decimal of at most 15 digits,
    whose shortest text is that decimal (msgspec writes it); a one-digit mantissa is an
    integer, as Go writes ``3e+09``, not ``3.0e+09``. One msgspec call per exponent: the
    exponent is then pasted after every mantissa by ``str.replace``."""
    import numpy as np

    digits_above = 10.0 ** np.arange(1, 17)  # a whole v >= 10 has searchsorted(v) + 1 digits
    powers = 10.0 ** np.arange(0, 17)  # exact as doubles
    exponent = np.searchsorted(digits_above, numbers, side="right")
    mantissa = numbers / powers[exponent]
    units = mantissa == np.floor(mantissa)
    digits = mantissa.astype(object)
    if units.any():
        digits[units] = mantissa[units].astype(np.int64).tolist()
    texts = np.empty(len(numbers), dtype=object)
    for k in np.unique(exponent).tolist():
        at = exponent == k
        suffix = _EXPONENTS[k]
        body = _encode_json(digits[at].tolist())[1:-1].decode()
        texts[at] = (body.replace(",", suffix + ",") + suffix).split(",")
    return texts


class GoFloats(dict[float, str]):
    """Go float text per value for one render: limits, capacities and 0/1 flags repeat across
    GPUs, and a dict lookup is a third of a repr. Zeros are never stored (0.0 == -0.0)."""

    def __missing__(self, value: float) -> str:
        text = go_float(float(value))
        if value:
            self[value] = text
        return text
