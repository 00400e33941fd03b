"""'/' listings from the prefix index: a page reads the entries it returns.

Which listings it serves: delimiter '/' and a prefix that is empty or ends in '/', the shape
of every directory-like listing (the aws cli's `ls`, a file browser). Every other delimiter
listing reads the object rows as before (objects.Objects._rolled_up): the index holds '/'
prefixes only, and under a prefix that does not end in '/' a common prefix may start in the
middle of a segment ("ab" over "abc/d" rolls up into "abc/", whose row says "abc/").

What it reads, per shard, in one statement (queries.LIST_PREFIX_INDEX): each vnode's index
rows under the prefix in order, merged, one kept per common prefix and checked with one index
probe for a key under it; and each vnode's keys whose directory is the prefix (the leaf index),
merged. So a page of P common prefixes costs about P index rows per vnode that holds keys under
each (at most the vnodes of the shard) and P probes, whatever the number of keys under them.

When it serves them: a probe costs what reading about 3 object rows in order does, and the
statement reads every vnode twice (index and keys), so where common prefixes hold few keys,
reading the rows is cheaper (bench/delimiter_bench.py). A '/' listing therefore reads rows
first, as any delimiter listing, and turns to the index where it would have turned to skip
scans (listing.prefer_skip_scan: prefixes hold many keys); it then remembers the bucket's
prefix as dense, and the next listing of it starts from the index (DenseListings).
"""

from __future__ import annotations

import functools
import uuid
from collections import OrderedDict

from psycopg import sql

from shoal.metadata import queries
from shoal.metadata.shards import render

DELIMITER = "/"
# Off, '/' listings read the object rows as other delimiters do: bench/delimiter_bench.py
# times both ways in one run, and the listing tests compare them.
ENABLED = True


# How many (bucket, prefix) pairs a process remembers as dense, the least recently listed
# forgotten first.
DENSE_REMEMBERED = 4096


class DenseListings:
    """The '/' listings (bucket incarnation, prefix) whose common prefixes proved to hold many
    keys, which start from the index; the rest read rows first. Only a cost: both are exact."""

    def __init__(self, size: int = DENSE_REMEMBERED) -> None:
        self.size = size
        self._seen: OrderedDict[tuple[uuid.UUID, str], None] = OrderedDict()

    def __contains__(self, listing: tuple[uuid.UUID, str]) -> bool:
        if listing not in self._seen:
            return False
        self._seen.move_to_end(listing)
        return True

    def add(self, listing: tuple[uuid.UUID, str]) -> None:
        self._seen[listing] = None
        self._seen.move_to_end(listing)
        while len(self._seen) > self.size:
            self._seen.popitem(last=False)


dense = DenseListings()


def serves(prefix: str, delimiter: str) -> bool:
    """Whether a listing of `prefix` with `delimiter` can read the prefix index."""
    return ENABLED and delimiter == DELIMITER and (not prefix or prefix.endswith(DELIMITER))


def starts_inside_a_prefix(prefix: str, lower: str) -> bool:
    """Whether a listing of `prefix` from name `lower` on starts inside one of its common
    prefixes, as a start-after key under one does. That common prefix is listed only if it
    holds a key from `lower` on, which its index row cannot say: such a listing reads rows
    first (objects.Objects._rolled_up). A next page never starts so: after a common prefix it
    starts past every name under it (listing.key_range)."""
    return DELIMITER in lower[len(prefix) :]


def segment_lower(prefix: str, lower: str) -> str:
    """The least segment under `prefix` a listing from name `lower` on returns: the index
    holds prefix + segment, and `lower` starts with `prefix` (listing.key_range)."""
    return lower[len(prefix) :]


@functools.lru_cache(maxsize=64)
def statement(vnodes: tuple[int, ...], upper_bound: bool) -> str:
    """The statement that lists the shard holding `vnodes` from its prefix index."""

    def each(template: str, joiner: str, bounded: bool = False) -> sql.SQL:
        return sql.SQL(joiner.join(render(template, vnode, bounded) for vnode in vnodes))

    def directory(template: str) -> str:
        return template.replace("{directory_of_name}", queries.DIRECTORY_OF_NAME)

    return (
        sql.SQL(queries.LIST_PREFIX_INDEX)
        .format(
            prefix_arms=each(queries.LIST_PREFIX_INDEX_ARM, "\nUNION ALL\n"),
            probes=each(directory(queries.PREFIX_HOLDS_KEYS), "\n"),
            leaf_arms=each(directory(queries.LIST_LEAVES_ARM), "\nUNION ALL\n", upper_bound),
            last_modified=sql.SQL(queries.LAST_MODIFIED),
            etag=sql.SQL(queries.ETAG),
        )
        .as_string(None)
    )
