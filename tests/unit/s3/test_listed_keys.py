"""Keys as a listing's XML shows them, decided for the whole page at once."""

from __future__ import annotations

from urllib.parse import quote
from xml.etree import ElementTree

from shoal.s3 import xml as s3xml
from shoal.s3.listing import listed_keys

PLAIN = ["photos/2024/a.jpg", "b_c-d.e~f", "0/1/2"]
AWKWARD = ["a b", "x&y", "<tag>", "ünï", "100%", "q?r=s", "plus+sign"]


def test_a_page_that_needs_nothing_is_returned_as_it_is() -> None:
    assert listed_keys(PLAIN, percent_encoded=False) is PLAIN
    assert listed_keys(PLAIN, percent_encoded=True) is PLAIN
    assert listed_keys([], percent_encoded=True) == []


def test_percent_encoding_matches_quote_key_by_key() -> None:
    keys = PLAIN + AWKWARD
    assert listed_keys(keys, percent_encoded=True) == [quote(k, safe="/") for k in keys]
    for key in AWKWARD:  # one awkward key among plain ones is found
        assert listed_keys([*PLAIN, key], percent_encoded=True)[-1] == quote(key, safe="/")


def test_xml_escaping_matches_text_key_by_key() -> None:
    keys = PLAIN + AWKWARD
    assert listed_keys(keys, percent_encoded=False) == [s3xml.text(k) for k in keys]
    assert listed_keys(["fine", "x&y"], percent_encoded=False) == ["fine", "x&amp;y"]
    assert listed_keys(["a b", "ünï"], percent_encoded=False) == ["a b", "ünï"]


def test_keys_with_carriage_returns_and_line_feeds_read_back_exactly() -> None:
    """A parser reads a raw carriage return as a line feed; the listing writes it so that the
    key read back is the key stored."""
    keys = ["a\rb", "c\r\nd", "e\nf", "plain"]
    listed = listed_keys(keys, percent_encoded=False)
    assert "\r" not in "".join(listed)
    body = "".join(f"<Key>{key}</Key>" for key in listed)
    read = ElementTree.fromstring(f"<Keys>{body}</Keys>")
    assert [element.text for element in read] == keys
    document = s3xml.document("Error", {"Resource": "/b/x\ry&z"})
    assert ElementTree.fromstring(document)[0].text == "/b/x\ry&z"
