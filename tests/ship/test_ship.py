"""Packing, storing and unpacking a job's working directory (file:// and memory://)."""

from __future__ import annotations

import io
import os
import tarfile
import uuid
from pathlib import Path

import fsspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spotd.core.spec import CodeRef, JobSpec
from spotd.ship.pack import WorkdirError, pack_folder
from spotd.ship.store import MARKER, archive_uri, fetch, storage_for, upload
from spotd.ship.workdir import ship_workdir


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode())
    return root


def names_in(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return sorted(m.name for m in tar.getmembers())


@pytest.fixture(params=["file", "memory"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return f"file://{tmp_path / 'storage'}"
    return f"memory://spotd-test-{uuid.uuid4().hex}"


def test_the_same_content_packs_to_the_same_bytes(tmp_path: Path) -> None:
    a = tree(tmp_path / "a", {"train.py": "print(1)\n", "data/x.txt": "x"})
    b = tree(tmp_path / "b", {"data/x.txt": "x", "train.py": "print(1)\n"})
    os.utime(b / "train.py", (1, 1))  # other times, other owners' clocks
    assert pack_folder(a).sha256 == pack_folder(b).sha256
    (b / "train.py").write_text("print(2)\n")
    assert pack_folder(a).sha256 != pack_folder(b).sha256


def test_gitignore_and_spotdignore_leave_files_out(tmp_path: Path) -> None:
    root = tree(tmp_path / "w", {
        "train.py": "", ".gitignore": "*.log\noutputs/\n", "run.log": "", "outputs/w.bin": "",
        "sub/.spotdignore": "big.bin\n", "sub/big.bin": "", "sub/keep.txt": "",
        "sub/deep/big.bin": "", ".git/config": "", "notes/a.log": "",
    })  # fmt: skip
    packed = names_in(pack_folder(root).data)
    assert packed == [".gitignore", "sub/.spotdignore", "sub/keep.txt", "train.py"]


def test_a_negated_pattern_brings_a_file_back(tmp_path: Path) -> None:
    root = tree(tmp_path / "w", {".gitignore": "*.log\n!keep.log\n", "a.log": "", "keep.log": ""})
    assert names_in(pack_folder(root).data) == [".gitignore", "keep.log"]


def test_executable_bits_and_links_survive(tmp_path: Path, storage: str) -> None:
    root = tree(tmp_path / "w", {"run.sh": "#!/bin/sh\necho hi\n", "data.txt": "d"})
    (root / "run.sh").chmod(0o755)
    (root / "link.txt").symlink_to("data.txt")
    ref, _ = upload(pack_folder(root), storage)
    out = fetch(ref, tmp_path / "node" / "code")
    assert os.access(out / "run.sh", os.X_OK)
    assert not os.access(out / "data.txt", os.X_OK)
    assert (out / "link.txt").is_symlink() and (out / "link.txt").read_text() == "d"


def test_a_folder_over_the_limit_names_what_is_large(tmp_path: Path) -> None:
    root = tree(tmp_path / "w", {"train.py": "x", "checkpoints/a.bin": "y" * 3000})
    with pytest.raises(WorkdirError) as err:
        pack_folder(root, max_bytes=1000)
    message = str(err.value)
    assert str(root) in message and "over the" in message
    assert "checkpoints (0.0 MiB)" in message and ".spotdignore" in message


def test_a_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(WorkdirError, match="is not a folder on this machine"):
        pack_folder(tmp_path / "nope")


def test_the_same_content_is_uploaded_once(tmp_path: Path, storage: str) -> None:
    root = tree(tmp_path / "w", {"train.py": "print(1)\n"})
    ref, wrote = upload(pack_folder(root), storage)
    again, wrote_again = upload(pack_folder(root), storage)
    assert (wrote, wrote_again) == (True, False)
    assert again == ref and ref.uri == archive_uri(storage, ref.sha256)
    fs, path = fsspec.core.url_to_fs(storage)
    assert len(fs.ls(path, detail=False)) == 1


def test_fetch_unpacks_once_and_checks_the_digest(tmp_path: Path, storage: str) -> None:
    root = tree(tmp_path / "w", {"train.py": "print(1)\n"})
    ref, _ = upload(pack_folder(root), storage)
    dest = tmp_path / "node" / "code"
    assert fetch(ref, dest) == dest and (dest / "train.py").read_text() == "print(1)\n"
    assert (dest / MARKER).read_text().strip() == ref.sha256
    (dest / "train.py").write_text("changed by the job")
    fetch(ref, dest)  # already there: nothing fetched, nothing overwritten
    assert (dest / "train.py").read_text() == "changed by the job"
    wrong = ref.model_copy(update={"sha256": "0" * 64})
    with pytest.raises(WorkdirError, match="is not what was shipped"):
        fetch(wrong, tmp_path / "other")


def test_an_archive_escaping_its_folder_is_refused(tmp_path: Path) -> None:
    import hashlib

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        evil = tarfile.TarInfo("../escaped.txt")
        evil.size = 4
        tar.addfile(evil, io.BytesIO(b"evil"))
    data = raw.getvalue()
    (tmp_path / "evil.tar.gz").write_bytes(data)
    ref = CodeRef(uri=str(tmp_path / "evil.tar.gz"), sha256=hashlib.sha256(data).hexdigest(),
                  size_bytes=len(data), files=1)  # fmt: skip
    with pytest.raises(WorkdirError, match="cannot unpack"):
        fetch(ref, tmp_path / "node" / "code")
    assert not (tmp_path / "node" / "escaped.txt").exists()


def _spec(**extra: object) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "t",
            "command": ["python", "train.py"],
            "resources": {"gpus": ["A100"], "gpus_per_node": 1},
            **extra,
        }
    )


def test_ship_workdir_ships_only_a_local_folder(tmp_path: Path, storage: str) -> None:
    root = tree(tmp_path / "w", {"train.py": "print(1)\n"})
    shipped = ship_workdir(_spec(workdir=str(root)), storage)
    assert shipped.uploaded and shipped.spec.code is not None
    assert shipped.spec.workdir == str(root)
    again = ship_workdir(shipped.spec, storage)
    assert again.spec == shipped.spec and not again.uploaded, "code already set: as it is"
    on_image = ship_workdir(_spec(workdir="/opt/train-not-here"), storage)
    assert on_image.spec.code is None and not on_image.uploaded
    assert ship_workdir(_spec(), storage).spec.code is None


def test_storage_follows_the_config_then_the_checkpoints(tmp_path: Path) -> None:
    spec = _spec(checkpoint={"uri": "s3://team-bucket/runs/llama"})
    assert storage_for(spec, "gs://conf/code", tmp_path) == "gs://conf/code"
    assert storage_for(spec, None, tmp_path) == "s3://team-bucket/spotd-code"
    chained = _spec(checkpoint={"uri": "simplecache::s3://b/run"})
    assert storage_for(chained, None, tmp_path) == "simplecache::s3://b/spotd-code"
    assert storage_for(_spec(checkpoint={"uri": "/data/ckpt"}), None, tmp_path) == str(
        tmp_path / "code"
    )
    assert storage_for(_spec(), None, tmp_path) == str(tmp_path / "code")


names = st.text(alphabet="abcdefgh", min_size=1, max_size=6)
trees = st.dictionaries(
    st.lists(names, min_size=1, max_size=3).map("/".join), st.text(max_size=50), max_size=8
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(files=trees)
def test_what_is_unpacked_is_what_was_packed(
    files: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Paths that are a file and a folder at once cannot both exist: keep the files.
    files = {k: v for k, v in files.items() if not any(o.startswith(k + "/") for o in files)}
    base = tmp_path_factory.mktemp("prop")
    root = tree(base / "w", files)
    (root).mkdir(exist_ok=True)
    ref, _ = upload(pack_folder(root), f"memory://prop-{uuid.uuid4().hex}")
    out = fetch(ref, base / "out")
    got = {p.relative_to(out).as_posix(): p.read_bytes().decode() for p in out.rglob("*")
           if p.is_file() and p.name != MARKER}  # fmt: skip
    assert got == files
