"""All of the gateway's XML: responses rendered, request bodies parsed (defused).

Every document is in S3's namespace, written compact with an XML declaration, as S3 does.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from xml.etree import ElementTree

import defusedxml.ElementTree as SafeTree

from shoal.s3.errors import MalformedXML

NAMESPACE = "http://s3.amazonaws.com/doc/2006-03-01/"
MAX_REQUEST_XML_BYTES = 1024 * 1024

Tree = dict[str, Any]  # tag -> text, or nested Tree, or list of Trees for repeated tags


def document(root: str, body: Tree | str) -> bytes:
    """Render `{tag: value}` trees: lists repeat a tag, None skips it, datetimes are ISO 8601.

    A string body is the root element's text.
    """
    element = ElementTree.Element(root, xmlns=NAMESPACE)
    if isinstance(body, str):
        element.text = body or None
    else:
        _fill(element, body)
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + ElementTree.tostring(element)


def error_document(
    code: str, message: str, resource: str, request_id: str, fields: Mapping[str, str]
) -> bytes:
    element = ElementTree.Element("Error")
    _fill(
        element,
        {"Code": code, "Message": message, **fields, "Resource": resource, "RequestId": request_id},
    )
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + ElementTree.tostring(element)


def timestamp(moment: datetime) -> str:
    """S3's timestamps in XML: 2024-01-31T12:00:00.000Z."""
    return (
        moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
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


def text_of(element: ElementTree.Element, tag: str, required: bool = True) -> str | None:
    child = element.find(tag)
    if child is None or child.text is None:
        if required:
            raise MalformedXML(f"<{element.tag}> needs <{tag}>")
        return None
    return child.text.strip()


def _fill(parent: ElementTree.Element, body: Tree) -> None:
    for tag, value in body.items():
        for item in value if isinstance(value, list) else [value]:
            if item is None:
                continue
            child = ElementTree.SubElement(parent, tag)
            if isinstance(item, dict):
                _fill(child, item)
            elif isinstance(item, datetime):
                child.text = timestamp(item)
            elif isinstance(item, bool):
                child.text = "true" if item else "false"
            else:
                child.text = str(item)
