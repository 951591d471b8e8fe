"""fsutil's bounded reads: every file a user or a host hands pdlaunch is read with a size cap,
refused when it is not a regular file, and parsed as JSON without recursion or NaN."""

from __future__ import annotations

import os
import threading

import pytest

from pdlaunch.fsutil import (
    ReadRefused,
    json_depth,
    loads_json_bounded,
    read_bounded,
    read_json_bounded,
)


def test_reads_a_small_file_whole(tmp_path):
    f = tmp_path / "config.json"
    f.write_bytes(b'{"a": 1}')
    assert read_bounded(f, 100) == b'{"a": 1}'


def test_follows_a_symlink_to_a_regular_file(tmp_path):
    # Hugging Face snapshots link config.json into blobs/.
    blob = tmp_path / "blob"
    blob.write_text("{}")
    link = tmp_path / "config.json"
    link.symlink_to(blob)
    assert read_bounded(link, 10) == b"{}"


def test_refuses_a_file_over_the_cap_before_reading_it(tmp_path):
    f = tmp_path / "big"
    with open(f, "wb") as out:
        out.truncate(600 * 1024 * 1024)  # sparse: costs no disk
    with pytest.raises(ReadRefused, match="at most 1,024 are read"):
        read_bounded(f, 1024, what="model config")


def test_refuses_a_fifo_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    result: list[BaseException] = []

    def read() -> None:
        try:
            read_bounded(fifo, 100)
        except BaseException as exc:
            result.append(exc)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), "reading a FIFO hung"
    assert isinstance(result[0], ReadRefused)
    assert "a FIFO" in str(result[0])


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_refuses_devices(device):
    with pytest.raises(ReadRefused, match="character device"):
        read_bounded(device, 100)


def test_refuses_a_directory(tmp_path):
    with pytest.raises(ReadRefused, match="directory"):
        read_bounded(tmp_path, 100)


def test_missing_file_is_a_clear_refusal(tmp_path):
    with pytest.raises(ReadRefused, match="cannot be read"):
        read_bounded(tmp_path / "nope", 100, what="fabric file")


def test_depth_counts_nesting_but_not_brackets_in_strings():
    assert json_depth('{"a": [1, {"b": "[[[[\\"]]"}]}') == 3
    assert json_depth("[]") == 1
    assert json_depth('"x"') == 0


def test_deep_nesting_is_refused_not_a_recursion_error():
    with pytest.raises(ReadRefused, match="deeper than 64"):
        loads_json_bounded("[" * 100_000 + "]" * 100_000)


@pytest.mark.parametrize("text", ["NaN", '{"x": Infinity}', "[-Infinity]", '{"n": 1e999}'])
def test_non_finite_numbers_are_refused(text):
    with pytest.raises(ReadRefused, match="not valid JSON"):
        loads_json_bounded(text)


def test_ordinary_json_parses():
    assert loads_json_bounded('{"n": 1.5, "m": [1, 2]}') == {"n": 1.5, "m": [1, 2]}


def test_read_json_refuses_non_utf8(tmp_path):
    f = tmp_path / "x.json"
    f.write_bytes(b"\xff\xfe{}")
    with pytest.raises(ReadRefused, match="not UTF-8"):
        read_json_bounded(f, 100)
