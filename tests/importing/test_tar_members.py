"""A tar's members as the importer reads them: plain headers read directly, the same members and bytes as tarfile."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from guideloom.importing import ImportInputError, import_records
from guideloom.importing._tar_members import TarMember, TarMembers
from tests.helpers.import_inputs import add_member, stored_records


def _read(path: Path, through_tarfile: bool) -> list[tuple[TarMember, bytes | None]]:
    """Each member without ``tarfile``'s own member, and a file's data; ``through_tarfile``: all as ``tarfile``
    streams them (its stream mode reads a plain tar too)."""
    with open(path, "rb") as raw, TarMembers(raw, compressed=through_tarfile) as tar:
        return [(member._replace(info=None), tar.read(member) if member.kind == "file" else None) for member in tar]


def _special(tar: tarfile.TarFile, name: str, kind: bytes, target: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    tar.addfile(info)


def _mixed_tar(path: Path, tar_format: int, long_name: str) -> None:
    with tarfile.open(path, "w", format=tar_format) as tar:
        add_member(tar, "a.jpg", b"\xff\xd8" * 700)
        add_member(tar, "a.txt", b"")
        _special(tar, "folder", tarfile.DIRTYPE)
        add_member(tar, f"{'d' * 120}/b.txt", b"under a ustar prefix")
        _special(tar, "c.jpg", tarfile.SYMTYPE, "a.jpg")
        _special(tar, "c.png", tarfile.LNKTYPE, "a.jpg")
        _special(tar, "c.dev", tarfile.CHRTYPE)
        _special(tar, "c.fifo", tarfile.FIFOTYPE)
        add_member(tar, long_name, b"after an extension header")
        add_member(tar, "e.txt", b"last")


@pytest.mark.parametrize(
    ("tar_format", "long_name"),
    [
        (tarfile.USTAR_FORMAT, "d.txt"),
        (tarfile.PAX_FORMAT, "d-\N{SNOWMAN}.txt"),  # a pax header for the name, mid-tar
        (tarfile.GNU_FORMAT, "d" * 150 + ".txt"),  # a GNU long name header
    ],
    ids=["ustar", "pax", "gnu"],
)
def test_the_members_and_their_bytes_are_those_tarfile_reads(tmp_path: Path, tar_format: int, long_name: str) -> None:
    _mixed_tar(tmp_path / "mixed.tar", tar_format, long_name)
    read = _read(tmp_path / "mixed.tar", through_tarfile=False)
    assert read == _read(tmp_path / "mixed.tar", through_tarfile=True)
    assert [member.kind for member, _ in read] == ["file", "file", "directory", "file"] + ["link"] * 2 + [
        "special"
    ] * 2 + ["file", "file"]
    assert read[3][0].name == f"{'d' * 120}/b.txt" and read[8][1] == b"after an extension header"


def test_members_before_an_extension_header_are_read_directly_and_the_rest_by_tarfile(tmp_path: Path) -> None:
    _mixed_tar(tmp_path / "mixed.tar", tarfile.PAX_FORMAT, "d-\N{SNOWMAN}.txt")
    with open(tmp_path / "mixed.tar", "rb") as raw, TarMembers(raw, compressed=False) as tar:
        read_by_tarfile = [member.info is not None for member in tar]
    assert read_by_tarfile == [False] * 3 + [True] * 7  # pax writes a header for a name over 100 bytes


def _damage_header(path: Path, member: int) -> None:
    """Flip a byte of the name in the header of the ``member``-th member (each member here: header and one block)."""
    data = bytearray(path.read_bytes())
    data[member * 1024] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_damaged_header_mid_tar_is_an_error_naming_the_tar_and_row(tmp_path: Path) -> None:
    """tarfile ends a tar quietly at a damaged header after the first: the rows after it would be lost unsaid."""
    with tarfile.open(tmp_path / "damaged.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
        for key in range(6):
            add_member(tar, f"{key:03d}.txt", b"caption")
    _damage_header(tmp_path / "damaged.tar", 4)
    with pytest.raises(ImportInputError, match=r"damaged\.tar: a truncated or damaged tar, at row 3 \(.*checksum"):
        import_records([tmp_path / "damaged.tar"], tmp_path / "out", workers=1)


def test_a_tar_with_a_pax_header_mid_way_imports_every_row(tmp_path: Path) -> None:
    with tarfile.open(tmp_path / "pax.tar", "w", format=tarfile.PAX_FORMAT) as tar:
        for key in ["a", "b-\N{SNOWMAN}", "c"]:
            add_member(tar, f"{key}.txt", key.encode())
            add_member(tar, f"{key}.json", b'{"n": 1}')
    import_records([tmp_path / "pax.tar"], tmp_path / "out", workers=1)
    assert [record["__key__"] for record in stored_records(tmp_path / "out")] == ["a", "b-\N{SNOWMAN}", "c"]


def test_a_file_that_is_not_a_tar_is_named(tmp_path: Path) -> None:
    (tmp_path / "noise.tar").write_bytes(io.BytesIO(bytes(range(256)) * 8).getvalue())
    with pytest.raises(ImportInputError, match=r"noise\.tar: a truncated or damaged tar, at row 0"):
        import_records([tmp_path / "noise.tar"], tmp_path / "out", workers=1)
