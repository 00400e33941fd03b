"""'/' listings from the shard's directory: a page reads the entries it returns.

Which listings it serves: delimiter '/' and a prefix that is empty or ends in '/', the shape
of every directory-like listing (the aws cli's `ls`, a file browser). Every other delimiter
listing reads the object rows (objects.Objects._rolled_up): the directory holds '/' prefixes
only, and under a prefix that does not end in '/' a common prefix may start in the middle of
a segment ("ab" over "abc/d" rolls up into "abc/", whose row says "abc/").

What it reads, per shard (queries.LIST_DIRECTORY): the directory's rows under the prefix in
order, one kept per segment, which are the page's common prefixes; and, when a row says a
vnode of the shard holds keys in that directory, the keys of every vnode of the shard from
the leaf index, merged (one statement a shard to prepare; a vnode with none costs one index
probe). So a page of P common prefixes costs the directory rows of the P segments (one per
vnode that holds names under each), whatever the number of keys under them, and a shard's
keys are read only when it holds some.

Why the rows are exact: the vnodes' triggers add a common prefix's row in the transaction
that makes a name new and remove it in the transaction that deletes its vnode's last name
under it, ordered by an advisory lock per (bucket, common prefix, vnode) (schema.py, vnode
migration 5). Only the root's own row (parent and segment '') may outlive its keys, until
the bucket goes: it only says whether there are keys to read.
"""

from __future__ import annotations

import functools

from shoal.metadata import queries
from shoal.metadata.shards import render_arms

DELIMITER = "/"
# Off, '/' listings read the object rows as other delimiters do: bench/delimiter_bench.py
# times both ways in one run, and the listing tests compare them.
ENABLED = True


def serves(prefix: str, delimiter: str) -> bool:
    """Whether a listing of `prefix` with `delimiter` can read the directory."""
    return ENABLED and delimiter == DELIMITER and (not prefix or prefix.endswith(DELIMITER))


def starts_inside_a_prefix(prefix: str, lower: str) -> bool:
    """Whether a listing of `prefix` from name `lower` on starts inside one of its common
    prefixes, as a start-after key under one does. That common prefix is listed only if it
    holds a key from `lower` on, which its directory row cannot say: such a listing reads rows
    first (objects.Objects._rolled_up). A next page never starts so: after a common prefix it
    starts past every name under it (listing.key_range)."""
    return DELIMITER in lower[len(prefix) :]


def segment_lower(prefix: str, lower: str) -> str:
    """The least segment under `prefix` a listing from name `lower` on returns: the directory
    holds prefix + segment, and `lower` starts with `prefix` (listing.key_range)."""
    return lower[len(prefix) :]


@functools.lru_cache(maxsize=1024)
def leaves_statement(vnodes: tuple[int, ...], upper_bound: bool) -> str:
    """The statement that reads the keys of a directory on `vnodes` of one shard, in order."""
    return render_arms(queries.LIST_NAMES_MERGE, queries.LIST_LEAVES_ARM, vnodes, upper_bound)
