"""The gzipped k3s binary a join or an install uploads is compressed once per binary on this
machine, not once per run: kept in the user's private runtime directory, named by the binary's
SHA-256 and its own, and used only while its bytes still hash to that name. Real files and real
gzip; each "run" starts with an empty in-process memory, as a new provider process does."""

from __future__ import annotations

import gzip
import hashlib
import os
from pathlib import Path

import pytest

from node_operations import k3s_install
from node_operations.k3s_install import gzipped_binary


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    base = tmp_path / "run-user"
    base.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(base))
    monkeypatch.delenv("HK3S_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(k3s_install, "_GZIPPED", {})
    return base / "hk3s" / "k3s-gzipped"


def _binary(directory: Path, name: str, content: bytes) -> tuple[Path, str]:
    path = directory / name
    path.write_bytes(content)
    return path, hashlib.sha256(content).hexdigest()


def _new_process(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A new provider process: nothing in memory; counts what it compresses."""
    monkeypatch.setattr(k3s_install, "_GZIPPED", {})
    compressed: list[int] = []
    real = gzip.compress

    def counting(data: bytes, compresslevel: int = 9, **kwargs: object) -> bytes:
        compressed.append(len(data))
        return real(data, compresslevel=compresslevel)

    monkeypatch.setattr(k3s_install.gzip, "compress", counting)
    return compressed


def test_the_binary_is_compressed_once_and_read_back_by_the_next_run(
    runtime: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    content = os.urandom(1 << 16) * 8
    path, sha = _binary(tmp_path, "k3s", content)

    first = _new_process(monkeypatch)
    packed = gzipped_binary(path, sha)
    assert gzip.decompress(packed) == content and first == [len(content)]
    (entry,) = runtime.iterdir()
    assert entry.name == f"{sha}.{hashlib.sha256(packed).hexdigest()}.gz"
    assert (os.stat(runtime.parent).st_mode & 0o077) == 0, "the cache is not private to the user"

    second = _new_process(monkeypatch)
    assert gzipped_binary(path, sha) == packed and second == [], "the next run compressed the binary again"


def test_a_damaged_or_partial_entry_is_never_uploaded(
    runtime: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    content = b"k3s" * 50_000
    path, sha = _binary(tmp_path, "k3s", content)
    _new_process(monkeypatch)
    packed = gzipped_binary(path, sha)
    (entry,) = runtime.iterdir()
    entry.write_bytes(packed[: len(packed) // 2])  # cut short, as a full disk or a kill would leave it

    again = _new_process(monkeypatch)
    assert gzip.decompress(gzipped_binary(path, sha)) == content and again == [len(content)]
    assert [entry.name for entry in runtime.iterdir()] == [f"{sha}.{hashlib.sha256(packed).hexdigest()}.gz"]


def test_only_the_newest_binaries_are_kept(runtime: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names = []
    for index in range(6):
        path, sha = _binary(tmp_path, f"k3s-{index}", f"release {index} ".encode() * 1000)
        _new_process(monkeypatch)
        gzipped_binary(path, sha)
        names.append(sha)
        entry = next(runtime.glob(f"{sha}.*.gz"))
        os.utime(entry, (1_000_000 + index, 1_000_000 + index))
    assert sorted(entry.name.split(".")[0] for entry in runtime.glob("*.gz")) == sorted(names[2:])
    assert not list(runtime.glob(".new-*")), "a temporary file was left in the cache"
