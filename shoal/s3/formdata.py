"""multipart/form-data, read as it arrives: the small fields before the file whole, the file
part as a stream up to its boundary (a browser's POST upload, post.py).

S3 reads a form's fields up to the `file` field and ignores the ones after it; so does this
reader: `fields` stops at the file part and `file_chunks` streams it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from email.message import Message

from shoal.s3.errors import MalformedPOSTRequest, MaxPostPreDataLengthExceeded

# What S3 reads of the fields before the file: 20 KiB in all.
MAX_FIELDS_BYTES = 20 * 1024
MAX_PART_HEAD_BYTES = 8 * 1024


def boundary_of(content_type: str) -> str | None:
    """The boundary of a multipart/form-data Content-Type, or None for another type."""
    message = Message()
    message["content-type"] = content_type
    if message.get_content_type() != "multipart/form-data":
        return None
    boundary = message.get_param("boundary")
    if not isinstance(boundary, str) or not 1 <= len(boundary) <= 70:
        raise MalformedPOSTRequest()
    return boundary


@dataclass
class FilePart:
    filename: str
    content_type: str | None


class FormReader:
    """One form body: `await fields()`, then `file_chunks()` for the file part."""

    def __init__(self, body: AsyncIterator[bytes], boundary: str) -> None:
        self._body = body
        self._buffer = bytearray()
        self._ended = False  # the body has no more bytes
        self._delimiter = b"\r\n--" + boundary.encode("latin-1")
        self.file: FilePart | None = None

    async def fields(self) -> dict[str, str]:
        """The fields before the file part, names lowercased (S3 matches them so); `file`
        is set when a file part follows."""
        # The first boundary has no CRLF before it; read as if the body began with one.
        self._buffer += b"\r\n"
        fields: dict[str, str] = {}
        total = 0
        await self._skip_to_delimiter(MAX_FIELDS_BYTES)
        while await self._next_part_follows():
            name, filename, content_type = await self._part_head()
            if name == "file":
                self.file = FilePart(filename or "", content_type)
                return fields
            value = await self._small_part(MAX_FIELDS_BYTES - total)
            total += len(name) + len(value)
            if name not in fields:  # S3 keeps the first of a repeated field
                fields[name] = value.decode("utf-8", "replace")
        return fields

    async def file_chunks(self) -> AsyncIterator[bytes]:
        """The file part's bytes, up to (not including) its closing boundary."""
        keep = len(self._delimiter) - 1  # a delimiter may straddle two reads
        while True:
            found = self._buffer.find(self._delimiter)
            if found >= 0:
                if found:
                    yield bytes(self._buffer[:found])
                del self._buffer[:found]
                return
            if len(self._buffer) > keep:
                chunk = bytes(self._buffer[:-keep])
                del self._buffer[:-keep]
                yield chunk
            if not await self._more():
                raise MalformedPOSTRequest()

    async def _more(self) -> bool:
        if self._ended:
            return False
        try:
            chunk = await anext(self._body)
        except StopAsyncIteration:
            self._ended = True
            return False
        self._buffer += chunk
        return True

    async def _skip_to_delimiter(self, limit: int) -> bytes:
        """The bytes before the next delimiter (consumed with it), at most `limit`."""
        while True:
            found = self._buffer.find(self._delimiter)
            if found >= 0:
                before = bytes(self._buffer[:found])
                del self._buffer[: found + len(self._delimiter)]
                return before
            if len(self._buffer) > limit + len(self._delimiter):
                raise MaxPostPreDataLengthExceeded()
            if not await self._more():
                raise MalformedPOSTRequest()

    async def _next_part_follows(self) -> bool:
        """After a delimiter: True for a part's head, False for the closing `--`."""
        while len(self._buffer) < 2:
            if not await self._more():
                raise MalformedPOSTRequest()
        if self._buffer.startswith(b"--"):
            return False
        line_end = await self._find(b"\r\n", MAX_PART_HEAD_BYTES)
        if self._buffer[:line_end].strip(b" \t"):  # only padding may follow a delimiter
            raise MalformedPOSTRequest()
        del self._buffer[: line_end + 2]
        return True

    async def _part_head(self) -> tuple[str, str | None, str | None]:
        """(field name, file name, Content-Type) of the part whose head comes next."""
        if self._buffer.startswith(b"\r\n"):
            head = b""
            del self._buffer[:2]
        else:
            end = await self._find(b"\r\n\r\n", MAX_PART_HEAD_BYTES)
            head = bytes(self._buffer[:end])
            del self._buffer[: end + 4]
        message = Message()
        for line in head.decode("utf-8", "replace").split("\r\n"):
            name, colon, value = line.partition(":")
            if not colon:
                raise MalformedPOSTRequest()
            message[name.strip()] = value.strip()
        if message.get_content_disposition() != "form-data":
            raise MalformedPOSTRequest()
        field = message.get_param("name", header="content-disposition")
        if not isinstance(field, str):
            raise MalformedPOSTRequest()
        filename = message.get_filename()
        return field.lower(), filename, message.get("content-type")

    async def _small_part(self, limit: int) -> bytes:
        return await self._skip_to_delimiter(limit)

    async def _find(self, needle: bytes, limit: int) -> int:
        while True:
            found = self._buffer.find(needle)
            if found >= 0:
                return found
            if len(self._buffer) > limit:
                raise MalformedPOSTRequest()
            if not await self._more():
                raise MalformedPOSTRequest()
