"""All of the gateway's XML: responses rendered, request bodies parsed (defused).

Every document is in S3's namespace, written compact with an XML declaration, as S3 does.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from xml.etree import ElementTree
from xml.sax.saxutils import escape

import defusedxml.ElementTree as SafeTree

from shoal.s3.errors import MalformedXML

NAMESPACE = "http://s3.amazonaws.com/doc/2006-03-01/"
DECLARATION = '<?xml version="1.0" encoding="UTF-8"?>\n'
# A backstop: each caller refuses a body past its own limit first (MaxMessageLengthExceeded),
# the largest being CompleteMultipartUpload's 4 MiB (10,000 parts with checksums pass 1 MiB).
MAX_REQUEST_XML_BYTES = 4 * 1024 * 1024

Tree = dict[str, Any]  # tag -> text, or nested Tree, or list of Trees for repeated tags


class Fragment(str):
    """XML already rendered, tags included: `document` inserts it as it is. For the parts of
    a response a page repeats 1000 times, where one f-string per entry is ~3x cheaper than
    rendering a tree per entry."""


def text(value: str) -> str:
    """Element text, escaped (most keys and values need no escaping, so look first: four
    substring tests take less time than one regular expression search).

    A carriage return is written as a character reference: a parser reads a raw one as a
    line feed (XML's end-of-line handling), so a key holding one would come back changed."""
    if "&" in value or "<" in value or ">" in value or "\r" in value:
        return escape(value, _CARRIAGE_RETURN)
    return value


_CARRIAGE_RETURN = {"\r": "&#13;"}


def element(tag: str, body: Tree) -> Fragment:
    """One element rendered, to repeat inside a Fragment."""
    parts = [f"<{tag}>"]
    _render(parts, body)
    parts.append(f"</{tag}>")
    return Fragment("".join(parts))


def document(root: str, body: Tree | str) -> bytes:
    """Render `{tag: value}` trees: lists repeat a tag, None skips it, datetimes are ISO 8601.

    A string body is the root element's text. Written as strings rather than through
    ElementTree: a page of 1000 listed keys renders in about a quarter of the time.
    """
    parts = [DECLARATION, f'<{root} xmlns="{NAMESPACE}">']
    if isinstance(body, str):
        parts.append(text(body))
    else:
        _render(parts, body)
    parts.append(f"</{root}>")
    return "".join(parts).encode()


def error_document(
    code: str, message: str, resource: str, request_id: str, fields: Mapping[str, str]
) -> bytes:
    parts = [DECLARATION, "<Error>"]
    _render(
        parts,
        {"Code": code, "Message": message, **fields, "Resource": resource, "RequestId": request_id},
    )
    parts.append("</Error>")
    return "".join(parts).encode()


def timestamp(moment: datetime) -> str:
    """S3's timestamps in XML: 2024-01-31T12:00:00.000Z."""
    if moment.tzinfo is not UTC:
        moment = moment.astimezone(UTC)
    # Pages render many of these: %-formatting the fields measured faster than isoformat
    # (which formats the offset too, then is cut) and than an f-string with format specs.
    return "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ" % (  # noqa: UP031 - measured faster
        moment.year,
        moment.month,
        moment.day,
        moment.hour,
        moment.minute,
        moment.second,
        moment.microsecond // 1000,
    )


def parse(body: bytes, root: str) -> ElementTree.Element:
    """A request body's root element, namespace stripped from every tag; MalformedXML if not."""
    if len(body) > MAX_REQUEST_XML_BYTES:
        raise MalformedXML("The XML you provided was too large")
    try:
        element = SafeTree.fromstring(body)
    except Exception:  # defusedxml raises several kinds, all meaning "not acceptable XML"
        raise MalformedXML() from None
    for node in element.iter():
        if isinstance(node.tag, str) and "}" in node.tag:
            node.tag = node.tag.split("}", 1)[1]
    if element.tag != root:
        raise MalformedXML(f"expected <{root}>, found <{element.tag}>")
    return element


# In `check_children`: an element that may appear any number of times.
MANY = 0


def check_children(element: ElementTree.Element, allowed: Mapping[str, int]) -> None:
    """MalformedXML for a child that `allowed` does not name, or one that appears more often
    than it allows (MANY: any number), as S3 checks a document against its schema: a second
    <Status> or an unknown element is refused, never read past."""
    seen: dict[str, int] = {}
    for child in element:
        tag = child.tag
        if not isinstance(tag, str):
            continue  # a comment or processing instruction
        limit = allowed.get(tag)
        if limit is None:
            raise MalformedXML(f"<{element.tag}> has no <{tag}>")
        seen[tag] = seen.get(tag, 0) + 1
        if limit != MANY and seen[tag] > limit:
            raise MalformedXML(f"<{element.tag}> has at most {limit} <{tag}>")


def text_of(
    element: ElementTree.Element, tag: str, required: bool = True, stripped: bool = False
) -> str | None:
    """A child's text exactly as sent: keys, prefixes, markers and upload ids are byte strings
    in which every space counts. `stripped` is for numbers and fixed words (Quiet, Status,
    Days), where the whitespace of a pretty-printed body means nothing."""
    child = element.find(tag)
    if child is None or child.text is None:
        if required:
            raise MalformedXML(f"<{element.tag}> needs <{tag}>")
        return None
    return child.text.strip() if stripped else child.text


def _render(parts: list[str], body: Tree) -> None:
    # The most common values first: this runs for every field of every key of a listing.
    for tag, value in body.items():
        for item in value if type(value) is list else (value,):
            kind = type(item)
            if kind is str:
                value = text(item)
            elif kind is Fragment:
                parts.append(item)
                continue
            elif kind is int:
                value = str(item)
            elif item is None:
                continue
            elif kind is dict:
                parts.append(f"<{tag}>")
                _render(parts, item)
                parts.append(f"</{tag}>")
                continue
            elif isinstance(item, datetime):
                value = timestamp(item)
            elif kind is bool:
                value = "true" if item else "false"
            else:
                value = text(str(item))
            parts.append(f"<{tag}>{value}</{tag}>")
