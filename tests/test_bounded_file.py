"""exporter/bounded_file.py: one reader for every file a user names, bounded before the work."""

from __future__ import annotations

import os

import pytest

from exporter.bounded_file import USAGE, Wording, read_bounded
from exporter.errors import ConfigError, UsageError


def test_a_file_within_the_limit_is_read_whole(tmp_path):
    path = tmp_path / "ok"
    path.write_bytes(b"x" * 10)
    assert read_bounded(path, 10, USAGE, setting="--max-bytes") == b"x" * 10


def test_a_regular_file_over_the_limit_is_refused_by_its_size(tmp_path):
    path = tmp_path / "big"
    path.write_bytes(b"x" * 11)
    with pytest.raises(UsageError) as info:
        read_bounded(path, 10, USAGE, setting="--max-bytes")
    assert str(info.value) == f"{path}: 11 bytes, over the 10-byte limit (--max-bytes)"


def test_a_device_is_read_one_byte_past_the_limit_then_refused():
    with pytest.raises(UsageError) as info:
        read_bounded("/dev/zero", 1024, USAGE, setting="x")
    assert str(info.value) == "/dev/zero: over the 1024-byte limit (x)"


def test_the_callers_wording_and_error_class(tmp_path):
    wording = Wording(ConfigError, cannot_read="{key}: cannot read {path}: {reason}",
                      not_regular="{key}: {path} is not a regular file")
    with pytest.raises(ConfigError) as info:
        read_bounded(tmp_path / "nope", 10, wording, key="k")
    assert str(info.value) == f"k: cannot read {tmp_path / 'nope'}: No such file or directory"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # no writer: a blocking open would hang here
    with pytest.raises(ConfigError) as info:
        read_bounded(fifo, 10, wording, key="k")
    assert str(info.value) == f"k: {fifo} is not a regular file"


def test_a_fifo_nobody_writes_to_reads_as_empty_and_never_hangs(tmp_path):
    """A blocking open() of a FIFO waits for a writer for good: a config or table renamed
    over by one hung its reader (at run time, the reload thread and then SIGTERM)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert read_bounded(fifo, 10, USAGE, setting="x") == b""


def test_a_pipe_with_a_writer_is_read_to_its_end(tmp_path):
    read_end, write_end = os.pipe()
    os.write(write_end, b"from a pipe\n")
    os.close(write_end)
    try:
        assert read_bounded(f"/dev/fd/{read_end}", 100, USAGE, setting="x") == b"from a pipe\n"
    finally:
        os.close(read_end)


def test_the_arrivals_and_a_checked_file_go_through_the_bounded_reader(tmp_path, monkeypatch):
    """``simulate``'s hourly series ($GPUFLEET_DATA) and ``rules --check``'s files were read
    whole by open(): a FIFO hung them, /dev/zero filled the memory."""
    from exporter.generated import differs
    from exporter.outcome_sim import timeline

    monkeypatch.setattr(timeline, "MAX_ARRIVALS_BYTES", 1024)
    with pytest.raises(ValueError) as info:
        timeline.read_arrivals("/dev/zero")
    assert str(info.value) == "over the 1024-byte limit"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="missing column"):
        timeline.read_arrivals(fifo)  # no writer: empty, never a hang
    assert differs(fifo, "text") and differs(tmp_path / "missing", "text")
    assert differs(tmp_path.joinpath("zero"), "") is True
    os.symlink("/dev/zero", tmp_path / "zero")
    assert differs(tmp_path / "zero", "x" * 100)  # read to 101 bytes, not to the end
    same = tmp_path / "same"
    same.write_text("text")
    assert not differs(same, "text") and differs(same, "tex") and differs(same, "texts")
