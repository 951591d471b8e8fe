"""atomic_write: content and mode exactly as asked, and no symlink is ever written through."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from pdlaunch import fsutil
from pdlaunch.fsutil import atomic_write
from pdlaunch.plan.render import RenderedFile, write_files


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def umask_077():
    old = os.umask(0o077)
    yield
    os.umask(old)


def test_content_and_mode(tmp_path, umask_077):
    target = tmp_path / "state.json"
    atomic_write(target, "héllo\n")
    assert target.read_bytes() == "héllo\n".encode() and mode_of(target) == 0o600
    # Replacing keeps nothing of the old file; the mode is the one asked for, not umask's.
    atomic_write(target, b"\x00\x01", mode=0o755)
    assert target.read_bytes() == b"\x00\x01" and mode_of(target) == 0o755
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_symlink_at_the_destination_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    target = tmp_path / "out.sh"
    target.symlink_to(victim)
    atomic_write(target, "new", mode=0o644)
    assert not target.is_symlink() and target.read_text() == "new"
    assert victim.read_text() == "keep"


# Names a writer could have chosen predictably (render used `.NAME.tmp`).
PREDICTABLE = [".out.sh.tmp", "out.sh.tmp", ".out.sh.swp", "out.sh~", ".out.sh"]


def test_links_planted_at_predictable_temp_names_are_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    for name in PREDICTABLE:
        (tmp_path / name).symlink_to(victim)
    dangling = tmp_path / "nowhere"
    (tmp_path / ".out.sh.dangling.tmp").symlink_to(dangling)
    atomic_write(tmp_path / "out.sh", "new")
    assert (tmp_path / "out.sh").read_text() == "new" and victim.read_text() == "keep"
    assert all((tmp_path / n).is_symlink() for n in PREDICTABLE) and not dangling.exists()


@pytest.mark.parametrize("dangling", [False, True])
def test_the_temp_file_open_refuses_a_planted_link(tmp_path, dangling):
    # Whatever name is drawn, the open itself refuses an existing link (O_EXCL|O_NOFOLLOW).
    victim = tmp_path / "victim"
    if not dangling:
        victim.write_text("keep")
    link = tmp_path / ".out.sh.0123456789abcdef.tmp"
    link.symlink_to(victim)
    with pytest.raises(FileExistsError):
        fsutil._open_new(str(link))
    assert victim.exists() is not dangling
    if not dangling:
        assert victim.read_text() == "keep"


def test_a_failed_write_leaves_no_temp_file(tmp_path):
    (tmp_path / "out.sh").mkdir()  # os.replace cannot put a file over a directory
    with pytest.raises(IsADirectoryError):
        atomic_write(tmp_path / "out.sh", "x")
    assert [p.name for p in tmp_path.iterdir()] == ["out.sh"]


def test_render_writes_through_atomic_write(tmp_path, umask_077):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    out = tmp_path / "out"
    out.mkdir()
    (out / "p.sh").symlink_to(victim)
    (out / ".p.sh.tmp").symlink_to(victim)  # the name render used to write through
    files = [RenderedFile("p.sh", "#!/bin/sh\n", True), RenderedFile("index.md", "x\n", False)]
    write_files(files, out)
    assert victim.read_text() == "keep" and not (out / "p.sh").is_symlink()
    assert mode_of(out / "p.sh") == 0o755 and mode_of(out / "index.md") == 0o644


def test_render_syncs_its_directory_once_not_every_file(tmp_path, monkeypatch):
    # A render is repeatable from its input, so it keeps atomic replacement but not a sync per
    # file (two per file were most of a 1,000-instance render); the directory is synced once.
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(fsutil.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    files = [RenderedFile(f"p{i}.sh", f"#{i}\n", True) for i in range(20)]
    write_files(files, tmp_path / "out")
    assert len(synced) == 1
    assert [(tmp_path / "out" / f"p{i}.sh").read_text() for i in range(20)] == [
        f"#{i}\n" for i in range(20)
    ]
    synced.clear()
    atomic_write(tmp_path / "state.json", "{}")  # the default stays durable: file and dir
    assert len(synced) == 2
