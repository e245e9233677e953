"""Checkpoint layout: naming, completeness, ordering and URI handling."""

from __future__ import annotations

import importlib.util
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

from spotd import checkpoints as ck
from spotd.core.cadence import saves_on_notice
from spotd.core.errors import CheckpointError, SpotdError
from spotd.core.spec import JobSpec


def _make(root: Path, step: int, *, complete: bool) -> Path:
    folder = root / ck.checkpoint_name(step)
    folder.mkdir(parents=True)
    (folder / "weights.npy").write_bytes(b"w")
    if complete:
        (folder / ck.MARKER).write_bytes(b"")
    return folder


@pytest.fixture
def memory_root() -> Iterator[str]:
    uri = f"memory://spotd-test-{uuid.uuid4().hex}/ckpt"
    yield uri
    fs = fsspec.filesystem("memory")
    path = uri.removeprefix("memory://")
    if fs.exists(path):
        fs.rm(path, recursive=True)


def test_checkpoint_name_is_zero_padded() -> None:
    assert ck.checkpoint_name(40) == "step-00000040"
    assert ck.checkpoint_name(0) == "step-00000000"
    assert ck.checkpoint_name(123_456_789) == "step-123456789"
    with pytest.raises(ValueError):
        ck.checkpoint_name(-1)


def test_checkpoint_error_is_a_spotd_error() -> None:
    assert issubclass(CheckpointError, SpotdError)


@pytest.mark.parametrize(
    ("uri", "parts", "expected"),
    [
        ("/tmp/x/ckpt", ("step-00000001",), "/tmp/x/ckpt/step-00000001"),
        ("/tmp/x/ckpt/", ("step-00000001/", "_COMPLETE"), "/tmp/x/ckpt/step-00000001/_COMPLETE"),
        ("file:///tmp/x", ("a",), "file:///tmp/x/a"),
        ("memory://", ("a", "b"), "memory://a/b"),
        ("memory://root/", ("/a/",), "memory://root/a"),
        ("s3://bucket", ("a", "", "b"), "s3://bucket/a/b"),
        ("/", ("a",), "/a"),
        ("rel/dir", (), "rel/dir"),
    ],
)
def test_join(uri: str, parts: tuple[str, ...], expected: str) -> None:
    assert ck.join(uri, *parts) == expected


def test_list_complete_skips_torn_and_sorts_by_step(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    _make(root, 100, complete=True)
    _make(root, 20, complete=True)
    _make(root, 30, complete=False)  # torn: no marker
    _make(root, 5, complete=True)
    (root / "notes.txt").write_text("not a checkpoint")
    (root / "step-abc").mkdir()
    (root / "other").mkdir()
    # a marker that is a folder, not a file, does not count
    (root / ck.checkpoint_name(7)).mkdir()
    (root / ck.checkpoint_name(7) / ck.MARKER).mkdir()

    found = ck.list_complete(str(root))
    assert [c.step for c in found] == [5, 20, 100]
    assert found[0] == ck.CheckpointInfo(uri=str(root / "step-00000005"), step=5)
    assert ck.latest_complete(str(root)) == ck.CheckpointInfo(
        uri=str(root / "step-00000100"), step=100
    )


def test_numeric_order_beyond_eight_digits(tmp_path: Path) -> None:
    _make(tmp_path, 99_999_999, complete=True)
    _make(tmp_path, 100_000_000, complete=True)
    assert [c.step for c in ck.list_complete(str(tmp_path))] == [99_999_999, 100_000_000]


def test_missing_root_is_empty(tmp_path: Path) -> None:
    assert ck.list_complete(str(tmp_path / "nope")) == []
    assert ck.latest_complete(str(tmp_path / "nope")) is None
    assert ck.list_complete(f"file://{tmp_path}/nope") == []


def test_empty_root_and_only_torn(tmp_path: Path) -> None:
    assert ck.latest_complete(str(tmp_path)) is None
    _make(tmp_path, 10, complete=False)
    assert ck.latest_complete(str(tmp_path)) is None


def test_file_uri_keeps_the_scheme(tmp_path: Path) -> None:
    _make(tmp_path, 10, complete=True)
    _make(tmp_path, 20, complete=False)
    uri = f"file://{tmp_path}"
    assert ck.list_complete(uri) == [
        ck.CheckpointInfo(uri=f"file://{tmp_path}/step-00000010", step=10)
    ]
    assert ck.list_complete(uri + "/") == ck.list_complete(uri)


def test_mark_complete_local(tmp_path: Path) -> None:
    folder = _make(tmp_path, 3, complete=False)
    assert not ck.is_complete(str(folder))
    ck.mark_complete(str(folder))
    assert ck.is_complete(str(folder))
    assert (folder / ck.MARKER).is_file()
    # no temporary files left beside the marker
    assert sorted(p.name for p in folder.iterdir()) == [ck.MARKER, "weights.npy"]
    assert [c.step for c in ck.list_complete(str(tmp_path))] == [3]


def test_mark_complete_file_uri_creates_folder(tmp_path: Path) -> None:
    folder_uri = f"file://{tmp_path}/ckpt/{ck.checkpoint_name(8)}"
    ck.mark_complete(folder_uri)
    assert (tmp_path / "ckpt" / "step-00000008" / ck.MARKER).is_file()
    assert ck.latest_complete(f"file://{tmp_path}/ckpt") == ck.CheckpointInfo(
        uri=folder_uri, step=8
    )


def test_write_and_read_bytes_replace_atomically(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b.bin"
    ck.write_bytes(str(target), b"one")
    ck.write_bytes(f"file://{target}", b"two")
    assert ck.read_bytes(str(target)) == b"two"
    assert sorted(p.name for p in target.parent.iterdir()) == ["b.bin"]
    with pytest.raises(CheckpointError, match="nope"):
        ck.read_bytes(str(tmp_path / "nope"))


def test_memory_uri(memory_root: str) -> None:
    assert ck.list_complete(memory_root) == []
    for step in (30, 10, 20):
        folder = ck.join(memory_root, ck.checkpoint_name(step))
        ck.write_bytes(ck.join(folder, "weights.npy"), b"w")
        if step != 30:
            ck.mark_complete(folder)
    found = ck.list_complete(memory_root)
    assert found == [
        ck.CheckpointInfo(uri=f"{memory_root}/step-00000010", step=10),
        ck.CheckpointInfo(uri=f"{memory_root}/step-00000020", step=20),
    ]
    assert ck.read_bytes(ck.join(found[0].uri, "weights.npy")) == b"w"
    assert not ck.is_complete(ck.join(memory_root, ck.checkpoint_name(30)))


def test_root_that_is_a_file_raises(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(CheckpointError, match=str(path)):
        ck.list_complete(str(path))


def test_unknown_scheme_raises() -> None:
    with pytest.raises(CheckpointError, match="nosuchscheme://x"):
        ck.list_complete("nosuchscheme://x")


@pytest.mark.parametrize("uri", [
    "/srv/ckpt", "file:///srv/ckpt", "memory://ck/run", "simplecache::file:///srv/ckpt",
    "filecache::memory://ck/run", "simplecache::/srv/ckpt",
])
def test_locations_whose_backends_are_installed_can_be_opened(uri: str) -> None:
    ck.check_location(uri)  # raises if not


@pytest.mark.parametrize(("uri", "says"), [
    ("s4://b/run", "Protocol not known: s4"),
    ("nosuchcache::memory://ck", "Protocol not known: nosuchcache"),
])
def test_locations_the_daemon_cannot_open_are_named(uri: str, says: str) -> None:
    with pytest.raises(CheckpointError, match="this daemon cannot open such locations") as err:
        ck.check_location(uri)
    assert str(err.value).startswith(f"{uri}: ") and says in str(err.value)


@pytest.mark.parametrize(("uri", "package"), [
    ("gs://b/run", "gcsfs"), ("s3://b/run", "s3fs"), ("simplecache::az://c/run", "adlfs"),
])
def test_a_location_whose_backend_is_missing_names_the_package(uri: str, package: str) -> None:
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed here: such locations can be opened")
    with pytest.raises(CheckpointError) as err:
        ck.check_location(uri)
    assert str(err.value) == (
        f"{uri}: needs {package}, which this daemon lacks; pip install {package} beside the daemon"
    )


def test_unreadable_root_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Root ignores permission bits, so simulate what the filesystem says instead.
    def refuse(self: LocalFileSystem, path: str, detail: bool = False, **kw: object) -> None:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(LocalFileSystem, "ls", refuse)
    with pytest.raises(CheckpointError, match=str(tmp_path)):
        ck.list_complete(str(tmp_path))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads folders whatever their mode")
def test_unreadable_root_raises_for_real(tmp_path: Path) -> None:
    root = tmp_path / "locked"
    _make(root, 1, complete=True)
    root.chmod(0)
    try:
        with pytest.raises(CheckpointError, match=str(root)):
            ck.list_complete(str(root))
    finally:
        root.chmod(0o755)


@pytest.mark.parametrize(
    ("size_gb", "on_notice", "notice", "saved"),
    [
        (80, True, 120, True),  # 80 s to write + 10 s to react <= 120 s (AWS)
        (110, True, 120, True),  # exactly 120 s
        (111, True, 120, False),
        (80, True, 30, False),  # GCP and Azure give about 30 s
        (20, True, 30, True),
        (1, False, 120, False),  # a job that ignores the signal saves nothing
    ],
)
def test_saves_on_notice(size_gb: float, on_notice: bool, notice: int, saved: bool) -> None:
    spec = JobSpec.model_validate({
        "name": "j", "command": ["true"],
        "resources": {"gpus": ["H100"], "gpus_per_node": 8},
        "checkpoint": {"size_gb": size_gb, "on_notice": on_notice},
    })
    assert saves_on_notice(spec, notice) is saved


# -- a local location, probed at submit ----------------------------------------

_LINUX_MOUNTS = pytest.mark.skipif(
    not Path("/proc/self/mounts").is_file(), reason="no Linux mount table to read here"
)


@_LINUX_MOUNTS
@pytest.mark.parametrize(("uri", "says"), [
    ("/proc/spotd-ckpt/run", "/proc is on proc, a pseudo filesystem of the kernel, not storage"),
    ("file:///sys/fs/spotd-ckpt", "/sys/fs is on sysfs, a pseudo filesystem of the kernel"),
])
def test_a_location_on_a_kernel_pseudo_filesystem_is_refused(uri: str, says: str) -> None:
    with pytest.raises(CheckpointError) as err:
        ck.check_writable(uri)
    assert str(err.value).startswith(f"{uri}: {says}")


@pytest.mark.parametrize("scheme", ["", "file://"])
def test_a_missing_folder_at_the_top_of_the_filesystem_is_refused_not_made(scheme: str) -> None:
    top = Path(f"/nonexistent-spotd-{uuid.uuid4().hex[:8]}")
    uri = f"{scheme}{top}/ckpt"
    with pytest.raises(CheckpointError) as err:
        ck.check_writable(uri)
    assert str(err.value) == (
        f"{uri}: {top} does not exist, and spotd creates no folder at the top of the "
        "filesystem: create it first, or correct the path"
    )
    assert not top.exists()


def test_a_location_under_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes").write_text("x")
    with pytest.raises(CheckpointError, match=r"notes is a file, not a folder$"):
        ck.check_writable(str(tmp_path / "notes" / "ckpt"))


def test_a_location_yet_to_be_made_under_a_writable_folder_passes(tmp_path: Path) -> None:
    ck.check_writable(str(tmp_path / "a" / "b" / "ckpt"))
    ck.check_writable(f"file://{tmp_path}")
    assert list(tmp_path.iterdir()) == []  # nothing is made by looking


@pytest.mark.parametrize("uri", ["s3://b/run", "gs://b/run", "simplecache::s3://b/run"])
def test_a_remote_location_is_not_probed(uri: str) -> None:
    ck.check_writable(uri)  # no backend, credentials or network is asked for


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in any folder whatever its mode")
def test_a_folder_the_daemon_cannot_write_is_refused(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(CheckpointError, match=r"locked is not writable by the daemon's user$"):
        ck.check_writable(str(locked / "ckpt"))
