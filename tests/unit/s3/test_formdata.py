"""The form reader of POST Object: fields before the file whole, the file streamed up to its
boundary, whatever the sizes of the pieces the body arrives in."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from shoal.s3 import formdata
from shoal.s3.errors import MalformedPOSTRequest, MaxPostPreDataLengthExceeded

BOUNDARY = "----form-boundary"


def form(fields: dict[str, str], data: bytes, after: str = "") -> bytes:
    parts = [
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in fields.items()
    ]
    parts.append(
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="a b.txt"\r\n'
        "Content-Type: text/plain\r\n\r\n".encode()
        + data
        + b"\r\n"
    )
    if after:
        parts.append(
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="late"\r\n\r\n'.encode()
            + f"{after}\r\n".encode()
        )
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


async def pieces(body: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


def read(body: bytes, size: int) -> tuple[dict[str, str], formdata.FilePart | None, bytes]:
    async def run() -> tuple[dict[str, str], formdata.FilePart | None, bytes]:
        reader = formdata.FormReader(pieces(body, size), BOUNDARY)
        fields = await reader.fields()
        data = b""
        if reader.file is not None:
            data = b"".join([chunk async for chunk in reader.file_chunks()])
        return fields, reader.file, data

    return asyncio.run(run())


@pytest.mark.parametrize("size", [1, 7, 64, 1 << 20])
def test_fields_and_file_in_pieces_of_any_size(size: int) -> None:
    # File bytes that look like a boundary's beginning are data, not a boundary.
    data = b"line\r\n--" + b"x" * 300 + f"\r\n--{BOUNDARY[:-1]}".encode() + b"end"
    body = form({"Key": "k/${filename}", "policy": "p"}, data, after="ignored")
    fields, file, got = read(body, size)
    assert fields == {"key": "k/${filename}", "policy": "p"}
    assert file == formdata.FilePart("a b.txt", "text/plain")
    assert got == data


def test_a_form_without_file_and_broken_forms() -> None:
    fields, file, data = read(form({"key": "k"}, b""), 5)
    assert file is not None and data == b""  # an empty file is still a file
    body = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="key"\r\n\r\nk\r\n--{BOUNDARY}--'
    fields, file, _ = read(body.encode(), 3)
    assert fields == {"key": "k"} and file is None
    with pytest.raises(MalformedPOSTRequest):
        read(form({"key": "k"}, b"data")[:-30], 4)  # cut inside the file
    with pytest.raises(MalformedPOSTRequest):
        read(b"no form at all", 4)
    with pytest.raises(MaxPostPreDataLengthExceeded):
        read(form({"big": "x" * 30_000}, b""), 1024)


def test_boundary_of() -> None:
    assert formdata.boundary_of(f"multipart/form-data; boundary={BOUNDARY}") == BOUNDARY
    assert formdata.boundary_of('multipart/form-data; boundary="a b"') == "a b"
    assert formdata.boundary_of("text/plain") is None
    with pytest.raises(MalformedPOSTRequest):
        formdata.boundary_of("multipart/form-data")
