"""Every statement the metadata API runs, with what it guarantees.

`{schema}` is the quoted vnode schema (manta_bucket_<vnode>); `{object_columns}` and
`{part_columns}` are the column lists below. Parameters are named (`%(owner)s`). All object and
part writes record each replaced version exactly once, under any interleaving: they take the
old row from the write itself (`RETURNING old.*`, PostgreSQL 18; `DELETE ... RETURNING`), which
sees the row version the write actually replaced, where RFD 149's CTE reads it from the
statement's snapshot and can miss a concurrent writer's version (a block leak) or record a
deleted one twice. A small object's version (`properties.inline`: its bytes are in its row)
leaves no record: no node holds anything of it, so GC would have nothing to do but drop it.

The one-row object writes stamp their times (created, modified, deleted_at) with
`statement_timestamp()`, not `current_timestamp`: they are group-committed (batched.py), and
in a batch's transaction `current_timestamp` is when the batch began. A write that waited
behind a row lock would then stamp a time older than the versions committed meanwhile, and
Last-Modified could go back. A statement's own start is what each write's own transaction
gave before batching.
"""

from __future__ import annotations

OBJECT_COLUMNS = (
    "id, owner, bucket_id, name, created, modified, creator, content_length, content_md5, "
    "content_type, headers, roles, sharks, properties"
)

# -- catalog shard -----------------------------------------------------------------------

SELECT_RING = """
SELECT r.version, v.vnode, v.shard
FROM shoal.ring r JOIN shoal.ring_vnode v USING (version)
WHERE r.version = (SELECT max(version) FROM shoal.ring)
ORDER BY v.vnode
"""

INSERT_RING = "INSERT INTO shoal.ring (version, vnodes) VALUES (%(version)s, %(vnodes)s)"

INSERT_RING_VNODE = """
INSERT INTO shoal.ring_vnode (version, vnode, shard) VALUES (%(version)s, %(vnode)s, %(shard)s)
"""

INSERT_ACCOUNT = """
INSERT INTO shoal.account (id, name) VALUES (%(id)s, %(name)s)
ON CONFLICT (name) DO NOTHING
RETURNING id, name, created
"""

SELECT_ACCOUNT = "SELECT id, name, created FROM shoal.account WHERE id = %(id)s"

SELECT_ACCOUNT_BY_NAME = "SELECT id, name, created FROM shoal.account WHERE name = %(name)s"

# Claims a bucket name for one owner across the ring (S3 names are global).
CLAIM_BUCKET_NAME = """
INSERT INTO shoal.bucket_name (name, owner, bucket_id) VALUES (%(name)s, %(owner)s, %(id)s)
ON CONFLICT (name) DO NOTHING
RETURNING bucket_id
"""

SELECT_BUCKET_NAME = "SELECT owner, bucket_id FROM shoal.bucket_name WHERE name = %(name)s"

# A same-owner claim left by a create that died before its bucket row committed.
RECLAIM_BUCKET_NAME = """
UPDATE shoal.bucket_name SET bucket_id = %(id)s
WHERE name = %(name)s AND owner = %(owner)s AND bucket_id = %(old_id)s
"""

# Also tells every process that caches bucket incarnations to drop this one (bucket_cache.py);
# PostgreSQL delivers the notice when this commits, after the bucket's row is gone. The
# incarnation's CORS rules, ACL and inventory configurations go with it (no later incarnation
# would ever read them).
RELEASE_BUCKET_NAME = """
WITH released AS (
    DELETE FROM shoal.bucket_name WHERE name = %(name)s AND bucket_id = %(id)s RETURNING name
), cors_dropped AS (
    DELETE FROM shoal.bucket_cors WHERE bucket_id = %(id)s
), acl_dropped AS (
    DELETE FROM shoal.bucket_acl WHERE bucket_id = %(id)s
), inventory_dropped AS (
    DELETE FROM shoal.bucket_inventory WHERE bucket_id = %(id)s
)
SELECT EXISTS (SELECT FROM released) AS released,
       pg_notify('shoal_bucket_gone', %(owner)s::text || '/' || %(name)s)
"""

# -- buckets (on the bucket's vnode) ------------------------------------------------------

INSERT_BUCKET = """
INSERT INTO {schema}.manta_bucket (id, owner, name) VALUES (%(id)s, %(owner)s, %(name)s)
ON CONFLICT (owner, name) DO NOTHING
RETURNING id, owner, name, created
"""

SELECT_BUCKET = """
SELECT id, owner, name, created FROM {schema}.manta_bucket
WHERE owner = %(owner)s AND name = %(name)s
"""

# Moves exactly the incarnation that was checked (id) into the deleted-bucket table.
# Only while the delete's own mark still holds back writes (none can have been acknowledged
# since the emptiness check); with the bucket go all its marks.
DELETE_BUCKET = """
WITH gone AS (
    DELETE FROM {schema}.manta_bucket b
    WHERE b.owner = %(owner)s AND b.name = %(name)s AND b.id = %(id)s
      AND EXISTS (
          SELECT 1 FROM {schema}.manta_bucket_deleting d
          WHERE d.owner = b.owner AND d.name = b.name AND d.token = %(token)s
            AND d.since > current_timestamp - %(mark_lifetime)s::interval)
    RETURNING id, owner, name, created
), record AS (
    INSERT INTO {schema}.manta_bucket_deleted_bucket (id, owner, name, created)
    SELECT id, owner, name, created FROM gone
), unmarked AS (
    DELETE FROM {schema}.manta_bucket_deleting d USING gone
    WHERE d.owner = gone.owner AND d.name = gone.name
)
SELECT id FROM gone
"""

# DeleteBucket's first step: writes that commit from now on are not acknowledged.
MARK_BUCKET_DELETING = """
INSERT INTO {schema}.manta_bucket_deleting (owner, name, id, token)
SELECT owner, name, id, %(token)s FROM {schema}.manta_bucket
WHERE owner = %(owner)s AND name = %(name)s AND id = %(id)s
RETURNING id
"""

# A delete removes its own mark only: another delete of the bucket may be under way.
UNMARK_BUCKET_DELETING = """
DELETE FROM {schema}.manta_bucket_deleting
WHERE owner = %(owner)s AND name = %(name)s AND token = %(token)s
"""

# Read by every object write after its commit: whether the incarnation it wrote into still
# takes writes. A mark older than %(mark_lifetime)s was left by a delete that died.
BUCKET_TAKES_WRITES = """
SELECT 1 FROM {schema}.manta_bucket b
WHERE b.owner = %(owner)s AND b.name = %(name)s AND b.id = %(id)s
  AND NOT EXISTS (
      SELECT 1 FROM {schema}.manta_bucket_deleting d
      WHERE d.owner = b.owner AND d.name = b.name AND d.id = b.id
        AND d.since > current_timestamp - %(mark_lifetime)s::interval)
"""

# One arm per vnode of a shard, joined with UNION ALL; the outer query merges them.
LIST_BUCKETS_ARM = """
(SELECT id, owner, name, created FROM {schema}.manta_bucket
 WHERE owner = %(owner)s AND name >= %(lower)s {upper_bound}
 ORDER BY name LIMIT %(limit)s)
"""

# True if any vnode of the shard holds an object, upload or part of the incarnation.
BUCKET_HAS_CONTENT_ARM = """
SELECT 1 FROM {schema}.manta_bucket_object WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s
UNION ALL
SELECT 1 FROM {schema}.manta_bucket_upload WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s
"""

# True if any vnode of the shard holds an object of the incarnation (open uploads do not keep
# a bucket from a delete).
BUCKET_HAS_OBJECTS_ARM = """
SELECT 1 FROM {schema}.manta_bucket_object WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s
"""

# -- objects (on the object's vnode) ------------------------------------------------------

# -- the '/' directory (shoal.bucket_directory: shard migration 2, vnode migration 5) -----
#
# Each shard keeps a row (parent, segment, vnode) for every '/' common prefix under which a
# vnode of it holds names, and a row (directory, '', vnode) for the directories a vnode holds
# names in. The vnodes' triggers keep them in the transaction of each write (schema.py,
# vnode migration 5), so PUT and DELETE name no table of it; a '/' listing reads the
# directory with one index scan a shard (LIST_DIRECTORY, docs/metadata.md, "The '/'
# directory").

# Vnode migration 4's prefix index, kept as that migration wrote it (migration 5 drops the
# table): the (parent, segment) rows of the name {name}, one per '/' in it.
PREFIXES_OF_NAME = """\
SELECT array_to_string(split.parts[1:level - 1], '/')
       || CASE WHEN level > 1 THEN '/' ELSE '' END AS parent,
       split.parts[level] || '/' AS segment
FROM (SELECT string_to_array({name}, '/') AS parts) AS split,
     generate_series(1, cardinality(split.parts) - 1) AS level"""

FILL_PREFIX_INDEX = (
    """
INSERT INTO {schema}.manta_bucket_prefix (owner, bucket_id, parent, segment)
SELECT DISTINCT o.owner, o.bucket_id, prefix_row.parent, prefix_row.segment
FROM {schema}.manta_bucket_object o CROSS JOIN LATERAL ("""
    + PREFIXES_OF_NAME.replace("{name}", "o.name")
    + """) AS prefix_row
ON CONFLICT DO NOTHING
"""
)

# Every directory row of the names vnode {vnode} holds (vnode migration 5 fills the directory
# with it; bulk loads that write manta_bucket_object with its triggers off, as
# bench/delimiter_bench.py does, run it after).
FILL_DIRECTORY = """
INSERT INTO shoal.bucket_directory (owner, bucket_id, parent, segment, vnode)
SELECT DISTINCT o.owner, o.bucket_id, level.parent, level.segment, {vnode}
FROM {schema}.manta_bucket_object o CROSS JOIN LATERAL shoal.directory_levels(o.name) AS level
ON CONFLICT DO NOTHING
"""

# The directory rows of vnode %(vnode)s, which go with the vnode's copy on a shard that no
# longer holds it (moves.py), in the transaction that drops the copy.
FORGET_VNODE_DIRECTORY = "DELETE FROM shoal.bucket_directory WHERE vnode = %(vnode)s"

# The directory of a name under '/': all of it up to its last '/' ('' for a name with none).
# The leaf index of manta_bucket_object (vnode migration 4) is on this expression, and
# LIST_LEAVES_ARM must spell it exactly so for PostgreSQL to use that index.
DIRECTORY_OF_NAME = (
    "(CASE WHEN strpos(name, '/') = 0 THEN ''"
    " ELSE left(name, length(name) + 1 - strpos(reverse(name), '/')) END)"
)

SELECT_OBJECT = """
SELECT {object_columns} FROM {schema}.manta_bucket_object
WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s AND name = %(name)s
"""

# With `data`: a small object's bytes, kept with its row (schema.py, vnode migration 2).
SELECT_OBJECT_WITH_DATA = """
SELECT {object_columns}, data FROM {schema}.manta_bucket_object
WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s AND name = %(name)s
"""

# Upsert; the replaced version (old.*) becomes a deletion record in the same statement.
PUT_OBJECT = """
WITH upsert AS (
    INSERT INTO {schema}.manta_bucket_object AS live (
        id, owner, bucket_id, name, created, modified, creator, content_length, content_md5,
        content_type, headers, roles, sharks, properties, data)
    VALUES (%(id)s, %(owner)s, %(bucket_id)s, %(name)s, statement_timestamp(),
            statement_timestamp(), %(creator)s, %(content_length)s, %(content_md5)s,
            %(content_type)s, %(headers)s, %(roles)s, %(sharks)s, %(properties)s, %(data)s)
    ON CONFLICT (owner, bucket_id, name) DO UPDATE SET
        id = EXCLUDED.id,
        created = EXCLUDED.created,
        modified = EXCLUDED.modified,
        creator = EXCLUDED.creator,
        content_length = EXCLUDED.content_length,
        content_md5 = EXCLUDED.content_md5,
        content_type = EXCLUDED.content_type,
        headers = EXCLUDED.headers,
        roles = EXCLUDED.roles,
        sharks = EXCLUDED.sharks,
        properties = EXCLUDED.properties,
        data = EXCLUDED.data
    RETURNING new.created, new.modified,
        old.id AS old_id, old.owner AS old_owner, old.bucket_id AS old_bucket_id,
        old.name AS old_name, old.created AS old_created, old.modified AS old_modified,
        old.creator AS old_creator, old.content_length AS old_content_length,
        old.content_md5 AS old_content_md5, old.content_type AS old_content_type,
        old.headers AS old_headers, old.roles AS old_roles, old.sharks AS old_sharks,
        old.properties AS old_properties
), record AS (
    INSERT INTO {schema}.manta_bucket_deleted_object ({object_columns}, deleted_at)
    SELECT old_id, old_owner, old_bucket_id, old_name, old_created, old_modified, old_creator,
           old_content_length, old_content_md5, old_content_type, old_headers, old_roles,
           old_sharks, old_properties, statement_timestamp()
    FROM upsert WHERE old_id IS NOT NULL AND old_properties -> 'inline' IS NULL
)
SELECT created, modified, old_id FROM upsert
"""

# If-Match: replaces the live version only if its ETag bytes match (`if_match` NULL, for
# If-Match: *: any live version), re-checked on the latest row version under a row lock, so
# the check and the write are one atomic step. No live version: no row.
REPLACE_OBJECT_IF_MATCH = """
WITH replaced AS (
    UPDATE {schema}.manta_bucket_object SET
        id = %(id)s,
        created = statement_timestamp(),
        modified = statement_timestamp(),
        creator = %(creator)s,
        content_length = %(content_length)s,
        content_md5 = %(content_md5)s,
        content_type = %(content_type)s,
        headers = %(headers)s,
        roles = %(roles)s,
        sharks = %(sharks)s,
        properties = %(properties)s,
        data = %(data)s
    WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s AND name = %(name)s
      AND (%(if_match)s::bytea IS NULL OR content_md5 = %(if_match)s::bytea)
    RETURNING new.created, new.modified,
        old.id AS old_id, old.owner AS old_owner, old.bucket_id AS old_bucket_id,
        old.name AS old_name, old.created AS old_created, old.modified AS old_modified,
        old.creator AS old_creator, old.content_length AS old_content_length,
        old.content_md5 AS old_content_md5, old.content_type AS old_content_type,
        old.headers AS old_headers, old.roles AS old_roles, old.sharks AS old_sharks,
        old.properties AS old_properties
), record AS (
    INSERT INTO {schema}.manta_bucket_deleted_object ({object_columns}, deleted_at)
    SELECT old_id, old_owner, old_bucket_id, old_name, old_created, old_modified, old_creator,
           old_content_length, old_content_md5, old_content_type, old_headers, old_roles,
           old_sharks, old_properties, statement_timestamp()
    FROM replaced WHERE old_properties -> 'inline' IS NULL
)
SELECT created, modified, old_id FROM replaced
"""

# If-None-Match: "<etag>": PUT_OBJECT, except that a live version with these ETag bytes stays
# (no row returned). The upsert's WHERE is checked on the conflicting row under its lock, so
# a version committed meanwhile is the one compared: the check and the write are one step.
PUT_OBJECT_IF_NONE_MATCH = PUT_OBJECT.replace(
    "        data = EXCLUDED.data\n",
    "        data = EXCLUDED.data\n"
    "    WHERE live.content_md5 IS DISTINCT FROM %(if_none_match)s::bytea\n",
)

# If-None-Match: * (create only): exactly one of many concurrent creators inserts.
CREATE_OBJECT = """
WITH inserted AS (
    INSERT INTO {schema}.manta_bucket_object (
        id, owner, bucket_id, name, created, modified, creator, content_length, content_md5,
        content_type, headers, roles, sharks, properties, data)
    VALUES (%(id)s, %(owner)s, %(bucket_id)s, %(name)s, statement_timestamp(),
            statement_timestamp(), %(creator)s, %(content_length)s, %(content_md5)s,
            %(content_type)s, %(headers)s, %(roles)s, %(sharks)s, %(properties)s, %(data)s)
    ON CONFLICT (owner, bucket_id, name) DO NOTHING
    RETURNING created, modified
)
SELECT created, modified, NULL::uuid AS old_id FROM inserted
"""

# An object's tags (properties.tags; none: the key removed), set on the version a tagging
# request read (id): a version that replaced it meanwhile keeps its own tags. Data, ETag and
# Last-Modified stay (S3 does not change Last-Modified for tags), and nothing is replaced,
# so there is no deletion record.
UPDATE_OBJECT_TAGS = """
UPDATE {schema}.manta_bucket_object SET
    properties = (coalesce(properties, '{{}}'::jsonb) - 'tags')
        || CASE WHEN %(tags)s::jsonb = '{{}}'::jsonb THEN '{{}}'::jsonb
                ELSE jsonb_build_object('tags', %(tags)s::jsonb) END
WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s AND name = %(name)s AND id = %(id)s
RETURNING id
"""

# An object's canned ACL (properties.acl; private: the key removed), set on the version an
# ACL request read (id), as UPDATE_OBJECT_TAGS sets tags.
UPDATE_OBJECT_ACL = """
UPDATE {schema}.manta_bucket_object SET
    properties = (coalesce(properties, '{{}}'::jsonb) - 'acl')
        || CASE WHEN %(acl)s = 'private' THEN '{{}}'::jsonb
                ELSE jsonb_build_object('acl', %(acl)s::text) END
WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s AND name = %(name)s AND id = %(id)s
RETURNING id
"""

# The deleted row comes from DELETE ... RETURNING: only the deleter that removed it records it.
_DELETE_LIVE_VERSION = """
WITH gone AS (
    DELETE FROM {schema}.manta_bucket_object
    WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s AND name = %(name)s
      AND (%(if_match)s::bytea IS NULL OR content_md5 = %(if_match)s::bytea)
    RETURNING {object_columns}
), record AS (
    INSERT INTO {schema}.manta_bucket_deleted_object ({object_columns}, deleted_at)
    SELECT {object_columns}, statement_timestamp() FROM gone
    WHERE properties -> 'inline' IS NULL
)
"""
# The deleted version whole, for a caller that looks at it.
DELETE_OBJECT = _DELETE_LIVE_VERSION + "SELECT {object_columns} FROM gone\n"
# Only its id: S3's DeleteObject answers the same whatever was deleted, and sending back and
# decoding the whole row was a large share of the gateway's CPU per DELETE (`cpu_split.py delete
# --profile`).
DELETE_OBJECT_ID = _DELETE_LIVE_VERSION + "SELECT id FROM gone\n"

# DeleteObjects: the live versions of several names of one bucket on one vnode, in one
# statement. The rows are locked in name order first, the order in which a group-committed
# batch of writes (batched.py) takes them, so this statement and such a batch never wait for
# each other in a cycle. As in DELETE_OBJECT, only the deleter that removed a row records it.
DELETE_OBJECTS = """
WITH doomed AS (
    SELECT name AS doomed_name FROM {schema}.manta_bucket_object
    WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s AND name = ANY(%(names)s::text[])
    ORDER BY name
    FOR UPDATE
), gone AS (
    DELETE FROM {schema}.manta_bucket_object
    USING doomed
    WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s AND name = doomed_name
    RETURNING {object_columns}
), record AS (
    INSERT INTO {schema}.manta_bucket_deleted_object ({object_columns}, deleted_at)
    SELECT {object_columns}, statement_timestamp() FROM gone
    WHERE properties -> 'inline' IS NULL
)
SELECT name FROM gone
"""

# -- listing ------------------------------------------------------------------------------

# What a listing arm reads of each row besides its name (and common prefix): what the merges
# turn into LastModified, the size and the ETag (LAST_MODIFIED, ETAG below).
LISTED_COLUMNS = """\
modified, content_length, content_md5, jsonb_array_length(properties -> 'parts') AS parts_count"""

# A delimiter listing reads a shard's rows in name order, each row carrying the common prefix
# it rolls up into, and keeps one row per entry (LIST_PREFIXES_MERGE). Each arm may give up
# to the round's whole budget of rows; PostgreSQL merges the arms as a Merge Append and pulls
# only what the page takes.
LIST_PREFIXES_ARM = """
(SELECT name, shoal.common_prefix(name, %(prefix)s, %(delimiter)s) AS prefix,
        {listed_columns}
 FROM {schema}.manta_bucket_object
 WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s
   AND name >= %(lower)s {upper_bound}
 ORDER BY name LIMIT %(rows)s)
"""

# A skip scan over one vnode: each step is one index probe for the next name at or after
# `next`, where `next` jumps past the whole common prefix of the previous entry. So the
# work grows with the entries returned, not with the keys under each common prefix; but a
# step costs what reading many rows in order does (objects.list chooses between the two).
LIST_OBJECTS_SKIP_SCAN_ARM = """
(WITH RECURSIVE walk AS (
    (SELECT o.name, shoal.common_prefix(o.name, %(prefix)s, %(delimiter)s) AS prefix,
            o.modified, o.content_length, o.content_md5,
            jsonb_array_length(o.properties -> 'parts') AS parts_count, 1 AS step
     FROM {schema}.manta_bucket_object o
     WHERE o.owner = %(owner)s AND o.bucket_id = %(bucket_id)s
       AND o.name >= %(lower)s {upper_bound}
     ORDER BY o.name LIMIT 1)
    UNION ALL
    SELECT nxt.*, walk.step + 1
    FROM walk CROSS JOIN LATERAL (
        SELECT o.name, shoal.common_prefix(o.name, %(prefix)s, %(delimiter)s) AS prefix,
               o.modified, o.content_length, o.content_md5,
               jsonb_array_length(o.properties -> 'parts') AS parts_count
        FROM {schema}.manta_bucket_object o
        WHERE o.owner = %(owner)s AND o.bucket_id = %(bucket_id)s
          AND o.name >= CASE WHEN walk.prefix IS NULL THEN walk.name || chr(1)
                             ELSE shoal.successor(walk.prefix) END
          {upper_bound}
        ORDER BY o.name LIMIT 1
    ) nxt
    WHERE walk.step < %(arm_limit)s
 )
 SELECT {vnode} AS arm, name, prefix, modified, content_length, content_md5, parts_count
 FROM walk)
"""

# A listed key's modification time as S3 listings show it (2024-01-31T12:00:00.000Z, UTC,
# milliseconds cut, not rounded, as S3 does): formatted here, which costs PostgreSQL less
# than loading a datetime and formatting it in Python costs the gateway (docs/decisions.md,
# "The listing strategy").
# The colons are quoted text of the pattern so that no ':name' appears (pgbench would read it
# as a variable: bench/metadata_bench.py runs these statements).
LAST_MODIFIED = """\
to_char(modified AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24":"MI":"SS.MS"Z"') AS last_modified"""

# A listed key's ETag as S3 shows it (without its quotes): the MD5's hex digits, then `-N` for
# a multipart object of N parts (models.etag, for one object, says the same). Made here, the
# gateway loads one short text a row instead of a bytea and a count and formats them.
ETAG = """\
coalesce(encode(content_md5, 'hex'), '') || coalesce('-' || parts_count, '') AS etag"""

# A listing without a delimiter: each arm is read in name order, and PostgreSQL merges the
# arms as a Merge Append, pulling from each only the rows the page takes (a 1000-key page
# over 64 vnodes reads 1,001 rows, where bounded rounds of 32 rows an arm read 2,048 and
# sorted them: docs/decisions.md, "The listing strategy"; bench/listing_bench.py shows the
# rows each page reads). Each arm's LIMIT is the whole page, so one
# round is exact. Its columns are ObjectSummary's fields, in their order (objects._summaries).
LIST_NAMES_ARM = """
(SELECT name, {listed_columns}
 FROM {schema}.manta_bucket_object
 WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s
   AND name >= %(lower)s {upper_bound}
 ORDER BY name LIMIT %(limit)s)
"""

LIST_NAMES_MERGE = """
SELECT name, {last_modified}, content_length, {etag}
FROM ({arms}) AS arms
ORDER BY name
LIMIT %(limit)s
"""

# Up to %(limit)s entries from the first %(rows)s rows of a shard, in name order. A row's
# entry key is its common prefix, or its name when it has none; keys never decrease in name
# order (every name under a prefix P sorts after P and before any name that does not start
# with P), so a group of rows with one key is contiguous, and the last row of each group
# stands for its entry (`lead` looks one row ahead; no sort). When the budget of rows ran
# out, the entry of the last row read is the page's last, and the page is complete up to
# its key (`through`, set on that row only); the caller's next round starts after it, past
# every name under it if it is a prefix.
LIST_PREFIXES_MERGE = """
SELECT key, prefix, {last_modified}, content_length, {etag},
       CASE WHEN row_read >= %(rows)s THEN key END AS through
FROM (SELECT ordered.*, coalesce(prefix, name) COLLATE "C" AS key,
             lead(coalesce(prefix, name)) OVER by_name AS next_key,
             row_number() OVER by_name AS row_read
      FROM (SELECT * FROM ({arms}) AS arms ORDER BY name LIMIT %(rows)s) AS ordered
      WINDOW by_name AS (ORDER BY name)) AS keyed
WHERE next_key IS DISTINCT FROM key
ORDER BY name
LIMIT %(limit)s
"""

# Merges the skip-scan arms of one shard. An arm that came back full may have more entries
# after its last, so the merge is complete only up to the smallest last key of a full arm
# (`through`, NULL when no arm was full): entries past it are left for the caller's next
# round (objects.py). A common prefix found by several vnodes appears once.
LIST_OBJECTS_MERGE = """
WITH entries AS (
    SELECT arm, name, prefix, modified, content_length, content_md5, parts_count,
           coalesce(prefix, name) COLLATE "C" AS key
    FROM ({arms}) AS arms
), complete AS (
    SELECT min(last_key) AS through
    FROM (SELECT max(key) AS last_key FROM entries
          GROUP BY arm HAVING count(*) >= %(arm_limit)s) AS full_arms
)
SELECT DISTINCT ON (key) key, prefix, {last_modified}, content_length, {etag},
       complete.through
FROM entries CROSS JOIN complete
WHERE complete.through IS NULL OR key <= complete.through
ORDER BY key
LIMIT %(limit)s
"""

# A '/' listing of a prefix that ends in '/' (or of none), from the directory: the common
# prefixes are its rows under the prefix, the keys listed as themselves are those whose
# directory is the prefix (the leaf index), read only when the directory says a vnode of the
# shard holds some. So a page reads what it returns, whatever the keys under each common
# prefix.
#
# One statement a shard: how many of the vnodes the caller's ring gives the shard it still
# holds (their schemas: a vnode that moved away is renamed at its fence, and the caller must
# follow the ring, as a statement naming the schema would), the first %(limit)s segments from
# %(segment_lower)s, and whether any of its vnodes holds keys in the directory.
LIST_DIRECTORY = """
SELECT (SELECT count(to_regnamespace('manta_bucket_' || vnode))
        FROM unnest(%(vnodes)s::int[]) AS vnode) AS held,
       ARRAY(SELECT DISTINCT segment FROM shoal.bucket_directory
             WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s AND parent = %(prefix)s
               AND segment >= %(segment_lower)s AND segment > ''
               AND vnode = ANY(%(vnodes)s::int[])
             ORDER BY segment
             LIMIT %(limit)s) AS segments,
       EXISTS (SELECT FROM shoal.bucket_directory
               WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s AND parent = %(prefix)s
                 AND segment = '' AND vnode = ANY(%(vnodes)s::int[])) AS has_keys
"""

# One vnode's keys whose directory is %(prefix)s, in order, from the leaf index; the arms of
# the vnodes LIST_DIRECTORY named are merged as LIST_NAMES_MERGE merges a listing's.
LIST_LEAVES_ARM = (
    """
(SELECT name, {listed_columns} FROM {schema}.manta_bucket_object
 WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s
   AND """
    + DIRECTORY_OF_NAME
    + """ = %(prefix)s
   AND name >= %(lower)s {upper_bound}
 ORDER BY name)
"""
)

LIST_BUCKETS_MERGE = """
SELECT id, owner, name, created FROM ({arms}) AS entries ORDER BY name LIMIT %(limit)s
"""

BUCKET_HAS_CONTENT = "SELECT EXISTS ({arms})"

# -- multipart uploads (on the vnode of the object they become) ---------------------------

PART_COLUMNS = "part_number, id, created, content_length, content_md5, sharks, properties"

# A part leaves the same deletion record as an object version; properties say which part.
PART_AS_DELETION_RECORD = """
    id, owner, bucket_id, name, created, created AS modified, NULL::uuid AS creator,
    content_length, content_md5, NULL::text AS content_type, NULL::hstore AS headers,
    NULL::uuid[] AS roles, sharks,
    coalesce(properties, '{}'::jsonb)
      || jsonb_build_object('upload_id', upload_id, 'part_number', part_number) AS properties
"""

INSERT_UPLOAD = """
INSERT INTO {schema}.manta_bucket_upload (
    id, owner, bucket_id, name, creator, content_type, headers, roles, properties)
VALUES (%(id)s, %(owner)s, %(bucket_id)s, %(name)s, %(creator)s, %(content_type)s,
        %(headers)s, %(roles)s, %(properties)s)
RETURNING id, owner, bucket_id, name, created, content_type, headers, properties
"""

SELECT_UPLOAD = """
SELECT id, owner, bucket_id, name, created, content_type, headers, properties
FROM {schema}.manta_bucket_upload
WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s AND name = %(name)s AND id = %(upload_id)s
"""

# Holds a share lock on the upload while the part is written, so a concurrent complete or
# abort (which deletes the upload row) waits; a replaced part number becomes a deletion record.
PUT_PART = """
WITH upload AS (
    SELECT id FROM {schema}.manta_bucket_upload
    WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s AND name = %(name)s
      AND id = %(upload_id)s
    FOR SHARE
), upsert AS (
    INSERT INTO {schema}.manta_bucket_upload_part (
        owner, bucket_id, upload_id, part_number, id, name, content_length, content_md5,
        sharks, properties)
    SELECT %(owner)s, %(bucket_id)s, upload.id, %(part_number)s, %(id)s, %(name)s,
           %(content_length)s, %(content_md5)s, %(sharks)s, %(properties)s
    FROM upload
    ON CONFLICT (owner, bucket_id, upload_id, part_number) DO UPDATE SET
        id = EXCLUDED.id,
        created = current_timestamp,
        content_length = EXCLUDED.content_length,
        content_md5 = EXCLUDED.content_md5,
        sharks = EXCLUDED.sharks,
        properties = EXCLUDED.properties
    RETURNING new.created, old.id AS old_id, old.owner AS old_owner,
        old.bucket_id AS old_bucket_id, old.upload_id AS old_upload_id,
        old.part_number AS old_part_number, old.name AS old_name,
        old.created AS old_created, old.content_length AS old_content_length,
        old.content_md5 AS old_content_md5, old.sharks AS old_sharks,
        old.properties AS old_properties
), record AS (
    INSERT INTO {schema}.manta_bucket_deleted_object ({object_columns})
    SELECT old_id, old_owner, old_bucket_id, old_name, old_created, old_created, NULL::uuid,
           old_content_length, old_content_md5, NULL::text, NULL::hstore, NULL::uuid[],
           old_sharks,
           coalesce(old_properties, '{{}}'::jsonb)
             || jsonb_build_object('upload_id', old_upload_id, 'part_number', old_part_number)
    FROM upsert WHERE old_id IS NOT NULL
)
SELECT created FROM upsert
"""

LIST_PARTS = """
SELECT {part_columns} FROM {schema}.manta_bucket_upload_part
WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s AND upload_id = %(upload_id)s
  AND part_number > %(after)s
ORDER BY part_number LIMIT %(limit)s
"""

LIST_UPLOADS_ARM = """
(SELECT id, owner, bucket_id, name, created, content_type, headers, properties
 FROM {schema}.manta_bucket_upload
 WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s
   AND (name, id) > (%(lower)s, %(after_id)s) {upper_bound}
 ORDER BY name, id LIMIT %(limit)s)
"""

LIST_UPLOADS_MERGE = """
SELECT * FROM ({arms}) AS entries ORDER BY name, id LIMIT %(limit)s
"""

# Complete and abort start by deleting the upload row: whichever comes first wins, and the
# row lock makes a concurrent part write wait for the outcome.
TAKE_UPLOAD = """
DELETE FROM {schema}.manta_bucket_upload
WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s AND name = %(name)s AND id = %(upload_id)s
RETURNING id
"""

LOCK_PARTS = """
SELECT {part_columns} FROM {schema}.manta_bucket_upload_part
WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s AND upload_id = %(upload_id)s
ORDER BY part_number
FOR UPDATE
"""

# Parts not in `keep` become deletion records; every part row goes (the object now names
# the kept parts in its properties).
RETIRE_PARTS = """
WITH gone AS (
    DELETE FROM {schema}.manta_bucket_upload_part
    WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s AND upload_id = %(upload_id)s
    RETURNING *
), record AS (
    INSERT INTO {schema}.manta_bucket_deleted_object ({object_columns})
    SELECT {part_as_deletion_record}
    FROM gone WHERE NOT (part_number = ANY(%(keep)s::int[]))
)
SELECT count(*) FROM gone
"""

# -- garbage collection ---------------------------------------------------------------------

# Oldest first, judged by the database clock; SKIP LOCKED lets several workers take
# disjoint batches, each held until its transaction ends.
CLAIM_DELETED_OBJECTS = """
SELECT {object_columns}, deleted_at FROM {schema}.manta_bucket_deleted_object
WHERE deleted_at < current_timestamp - %(leeway)s::interval
ORDER BY deleted_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""

REMOVE_DELETED_OBJECTS = """
DELETE FROM {schema}.manta_bucket_deleted_object
WHERE id = ANY(%(ids)s::uuid[])
"""

CLAIM_DELETED_BUCKETS = """
SELECT id, owner, name, created, deleted_at FROM {schema}.manta_bucket_deleted_bucket
WHERE deleted_at < current_timestamp - %(leeway)s::interval
ORDER BY deleted_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""

REMOVE_DELETED_BUCKET = """
DELETE FROM {schema}.manta_bucket_deleted_bucket
WHERE id = %(id)s AND owner = %(owner)s AND name = %(name)s
"""

# The live rows of a deleted incarnation, as deletion records would carry them.
BUCKET_OBJECTS_ARM = """
(SELECT {object_columns}, NULL::timestamptz AS deleted_at
 FROM {schema}.manta_bucket_object
 WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s
 ORDER BY name LIMIT %(limit)s)
"""

BUCKET_PARTS_ARM = """
(SELECT {part_as_deletion_record}, NULL::timestamptz AS deleted_at
 FROM {schema}.manta_bucket_upload_part
 WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s
 ORDER BY upload_id, part_number LIMIT %(limit)s)
"""

REMOVE_BUCKET_OBJECTS = """
DELETE FROM {schema}.manta_bucket_object
WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s AND id = ANY(%(ids)s::uuid[])
"""

REMOVE_BUCKET_PARTS = """
DELETE FROM {schema}.manta_bucket_upload_part
WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s AND id = ANY(%(ids)s::uuid[])
"""

# The incarnation's root row of the vnode in the '/' directory goes too (every reclaim of a
# deleted bucket runs this on each vnode): the deletes of its names removed every other row,
# but the root's, which names without a '/' leave, goes with the bucket only.
REMOVE_BUCKET_UPLOADS = """
WITH directory_gone AS (
    DELETE FROM shoal.bucket_directory
    WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s AND parent = '' AND segment = ''
      AND vnode = {vnode}
)
DELETE FROM {schema}.manta_bucket_upload u
WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s
  AND NOT EXISTS (
      SELECT 1 FROM {schema}.manta_bucket_upload_part p
      WHERE p.owner = u.owner AND p.bucket_id = u.bucket_id AND p.upload_id = u.id)
"""

# -- migrations, settings, windows, status -------------------------------------------------

LOCK_MIGRATIONS = "SELECT pg_advisory_xact_lock(%(key)s)"

APPLIED_VERSIONS = "SELECT scope, max(version) FROM shoal.schema_migrations GROUP BY scope"

APPLIED_IN_SCOPE = "SELECT version FROM shoal.schema_migrations WHERE scope = %(scope)s"

APPLIED_BY_SCOPE = "SELECT scope, array_agg(version) FROM shoal.schema_migrations GROUP BY scope"

RENUMBER_MIGRATION = """
UPDATE shoal.schema_migrations SET version = %(version)s
WHERE scope = %(scope)s AND version = %(old_version)s AND name = %(name)s
  AND NOT EXISTS (
      SELECT FROM shoal.schema_migrations WHERE scope = %(scope)s AND version = %(version)s)
"""

RECORD_MIGRATION = """
INSERT INTO shoal.schema_migrations (scope, version, name)
VALUES (%(scope)s, %(version)s, %(name)s)
"""

# Settings are fixed at first migrate; later configurations do not change them.
STORE_SETTING = """
INSERT INTO shoal.settings (key, value) VALUES (%(key)s, %(value)s)
ON CONFLICT (key) DO NOTHING
"""

SELECT_SETTING = "SELECT value FROM shoal.settings WHERE key = %(key)s"

DATABASE_NOW = "SELECT current_timestamp"

TABLE_EXISTS = "SELECT 1 FROM pg_tables WHERE schemaname = %(schema)s AND tablename = %(table)s"

COUNT_WINDOWS = """
SELECT count(*) FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND n.nspname LIKE 'manta\\_bucket\\_%%'
"""

DATABASE_NAMES = "SELECT datname FROM pg_database"

# -- storage node registry (catalog shard) ----------------------------------------------------

HEARTBEAT_NODE = """
INSERT INTO shoal.storage_node (
    name, datacenter, url, capacity_bytes, free_bytes, blocks, admin_url, heartbeat
)
VALUES (
    %(name)s, %(datacenter)s, %(url)s, %(capacity_bytes)s, %(free_bytes)s, %(blocks)s,
    %(admin_url)s, current_timestamp
)
ON CONFLICT (name) DO UPDATE SET
    datacenter = EXCLUDED.datacenter,
    url = EXCLUDED.url,
    capacity_bytes = EXCLUDED.capacity_bytes,
    free_bytes = EXCLUDED.free_bytes,
    blocks = EXCLUDED.blocks,
    admin_url = EXCLUDED.admin_url,
    heartbeat = current_timestamp
"""

# Liveness is judged by the database clock, so nodes and readers need not agree on time.
LIST_NODES = """
SELECT name, datacenter, url, capacity_bytes, free_bytes, blocks, admin_url, heartbeat,
       registered, heartbeat > current_timestamp - %(deadline)s::interval AS alive
FROM shoal.storage_node
ORDER BY name
"""

# The state an operator gave each node (migration 10): active, draining or dead.
NODE_STATES = "SELECT name, state FROM shoal.storage_node"

SET_NODE_STATE = """
UPDATE shoal.storage_node SET state = %(state)s WHERE name = %(name)s RETURNING name
"""

DELETE_NODE = "DELETE FROM shoal.storage_node WHERE name = %(name)s RETURNING name"

# -- access keys (catalog shard) ------------------------------------------------------------

INSERT_ACCESS_KEY = """
INSERT INTO shoal.access_key (access_key_id, account_id, secret_encrypted)
VALUES (%(access_key_id)s, %(account_id)s, %(secret_encrypted)s)
RETURNING access_key_id, account_id, secret_encrypted, created, revoked
"""

SELECT_ACCESS_KEY = """
SELECT access_key_id, account_id, secret_encrypted, created, revoked
FROM shoal.access_key WHERE access_key_id = %(access_key_id)s
"""

LIST_ACCESS_KEYS = """
SELECT access_key_id, account_id, secret_encrypted, created, revoked
FROM shoal.access_key WHERE account_id = %(account_id)s ORDER BY created
"""

REVOKE_ACCESS_KEY = """
UPDATE shoal.access_key SET revoked = current_timestamp
WHERE access_key_id = %(access_key_id)s AND revoked IS NULL
RETURNING access_key_id
"""

LIST_ACCOUNTS = "SELECT id, name, created FROM shoal.account ORDER BY name"

# -- garbage collection bookkeeping --------------------------------------------------------

SET_SETTING = """
INSERT INTO shoal.settings (key, value) VALUES (%(key)s, %(value)s)
ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value
"""

RECORD_GC_RUN = """
INSERT INTO shoal.gc_run (kind, leeway, started, records_found, records_reclaimed,
                          records_failed, blocks_deleted, bytes_reclaimed, windows_dropped)
VALUES (%(kind)s, %(leeway)s, %(started)s, %(records_found)s, %(records_reclaimed)s,
        %(records_failed)s, %(blocks_deleted)s, %(bytes_reclaimed)s, %(windows_dropped)s)
"""

LAST_GC_RUNS = """
SELECT kind, leeway, started, finished, records_found, records_reclaimed, records_failed,
       blocks_deleted, bytes_reclaimed, windows_dropped
FROM shoal.gc_run ORDER BY id DESC LIMIT %(limit)s
"""

# The backlog of one vnode: records, bytes and the oldest record, all from the deleted table.
GC_BACKLOG_ARM = """
SELECT count(*) AS records, coalesce(sum(content_length), 0) AS bytes,
       min(deleted_at) AS oldest
FROM {schema}.manta_bucket_deleted_object
UNION ALL
SELECT count(*), 0, min(deleted_at) FROM {schema}.manta_bucket_deleted_bucket
"""

GC_BACKLOG = """
SELECT sum(records)::bigint AS records, sum(bytes)::bigint AS bytes, min(oldest) AS oldest
FROM ({arms}) AS backlog
"""

# The windows of a vnode's deleted tables whose whole range is older than `before`.
OLD_WINDOWS = """
SELECT c.relname AS name, p.relname AS parent
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_class p ON p.oid = i.inhparent
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relkind = 'r'
  AND p.relname IN ('manta_bucket_deleted_object', 'manta_bucket_deleted_bucket')
"""

# Reclaiming a whole window. `{window}`, `{parent}` and `{table}` are identifiers filled in
# with psycopg.sql. A waiting ACCESS EXCLUSIVE request queues every writer of the window behind
# it, so GC waits for the lock only briefly and otherwise removes rows one by one.
WINDOW_LOCK_TIMEOUT = "SET LOCAL lock_timeout = '2s'"

LOCK_WINDOW = "LOCK TABLE {window} IN ACCESS EXCLUSIVE MODE"

# The ids of reclaimed deletion records (their blocks are gone), per vnode and window, staged
# on the remover's connection until their window is cleared: the ids of a large window stay
# in PostgreSQL, not in the remover's memory. A temporary table: private to the connection,
# gone with it.
CREATE_RECLAIMED = """
CREATE TEMPORARY TABLE IF NOT EXISTS gc_reclaimed (
    vnode integer NOT NULL, window_name text NOT NULL, id uuid NOT NULL
)
"""

COPY_RECLAIMED = "COPY gc_reclaimed (vnode, window_name, id) FROM STDIN"

ANALYZE_RECLAIMED = "ANALYZE gc_reclaimed"

# Each window's check and removal then look up its own staged ids, instead of reading every
# row the connection staged once per window.
INDEX_RECLAIMED = """
CREATE INDEX IF NOT EXISTS gc_reclaimed_ids ON gc_reclaimed (vnode, window_name, id)
"""

# The records staged for one window: what follows its vnode when the vnode moved away.
STAGED_RECLAIMED = """
SELECT vnode, window_name, id FROM gc_reclaimed
WHERE vnode = %(vnode)s AND window_name = %(window)s
"""

FORGET_RECLAIMED = "TRUNCATE gc_reclaimed"

# Does the window hold a row other than the reclaimed ones staged for it? (one hashed pass)
WINDOW_HOLDS_OTHERS = """
SELECT EXISTS (
    SELECT 1 FROM {window} w
    WHERE NOT EXISTS (
        SELECT 1 FROM gc_reclaimed r
        WHERE r.vnode = %(vnode)s AND r.window_name = %(window)s AND r.id = w.id
    )
)
"""

# {table}: the window, or the vnode's whole deleted-object table if the window is not there.
REMOVE_RECLAIMED = """
DELETE FROM {table} d USING gc_reclaimed r
WHERE r.vnode = %(vnode)s AND r.window_name = %(window)s AND d.id = r.id
"""

WINDOW_HOLDS_ANY = "SELECT EXISTS (SELECT 1 FROM {window})"

COUNT_WINDOW = "SELECT count(*) FROM {window}"

TRUNCATE_WINDOW = "TRUNCATE {window}"

DETACH_WINDOW = "ALTER TABLE {parent} DETACH PARTITION {window}"

DROP_WINDOW = "DROP TABLE {window}"

# Runs outside a transaction; on a partitioned table it vacuums every window.
VACUUM_TABLE = "VACUUM {table}"

# Is this id a part of an upload still open? (the audit re-checks findings with it)
PART_IS_OPEN = """
SELECT 1 FROM {schema}.manta_bucket_upload_part
WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s AND id = %(id)s
"""

# -- re-replication (on the object's vnode) ---------------------------------------------------

# A version or part written with fewer copies than the target, noted before its row commits
# (docs/storage.md, "Re-replication"). A second note of the same id changes nothing.
NOTE_UNDER_REPLICATED = """
INSERT INTO {schema}.manta_bucket_under_replicated (owner, bucket_id, name, id)
VALUES (%(owner)s, %(bucket_id)s, %(name)s, %(id)s)
ON CONFLICT DO NOTHING
"""

# The oldest notes of a vnode, held by one re-replicator until its transaction ends (SKIP
# LOCKED: two never copy the same version at once). `settled`: older than `grace` by the
# database clock, so a note whose version is not found is no write still committing.
CLAIM_UNDER_REPLICATED = """
SELECT owner, bucket_id, name, id,
       noted_at < current_timestamp - %(grace)s::interval AS settled
FROM {schema}.manta_bucket_under_replicated
ORDER BY noted_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""

REMOVE_UNDER_REPLICATED = """
DELETE FROM {schema}.manta_bucket_under_replicated WHERE id = ANY(%(ids)s::uuid[])
"""

# Notes that must wait (no node to copy to, no good replica to copy from) go to the back, so
# that they do not hold up the notes behind them batch after batch.
POSTPONE_UNDER_REPLICATED = """
UPDATE {schema}.manta_bucket_under_replicated SET noted_at = current_timestamp
WHERE id = ANY(%(ids)s::uuid[])
"""

# Where the blocks named by `id` are, if it is still live: the object's own version, a part of
# the completed multipart object (its properties.parts), or a part of an open upload.
# No row: the version was replaced or deleted (or its write has not committed yet).
LOCATE_UNDER_REPLICATED = """
SELECT content_length AS size, properties ->> 'block_size' AS block_size, sharks
FROM {schema}.manta_bucket_object
WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s AND name = %(name)s AND id = %(id)s
  AND properties -> 'inline' IS NULL
UNION ALL
SELECT (part ->> 'size')::bigint, part ->> 'block_size',
       ARRAY(SELECT jsonb_array_elements_text(part -> 'sharks'))
FROM {schema}.manta_bucket_object o, jsonb_array_elements(o.properties -> 'parts') AS part
WHERE o.owner = %(owner)s AND o.bucket_id = %(bucket_id)s AND o.name = %(name)s
  AND part ->> 'id' = %(id)s::text
UNION ALL
SELECT content_length, properties ->> 'block_size', sharks
FROM {schema}.manta_bucket_upload_part
WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s AND id = %(id)s
"""

# Adds the nodes that now hold copies to the sharks of `id`, wherever it is live (the three
# places LOCATE_UNDER_REPLICATED looks), and counts the rows changed. Each UPDATE re-checks
# its WHERE on the newest row version under the row's lock, so a version replaced or deleted
# meanwhile is not touched (0): the deletion record its replacement made already copied the
# old sharks, and a shark added after that would name a copy GC never deletes. Added sharks
# already named are skipped, so running it twice changes nothing.
ADD_SHARKS = """
WITH version AS (
    UPDATE {schema}.manta_bucket_object o
    SET sharks = o.sharks || ARRAY(
        SELECT s FROM unnest(%(added)s::text[]) AS s WHERE s <> ALL(o.sharks))
    WHERE o.owner = %(owner)s AND o.bucket_id = %(bucket_id)s AND o.name = %(name)s
      AND o.id = %(id)s
    RETURNING 1
), assembled AS (
    UPDATE {schema}.manta_bucket_object o
    SET sharks = o.sharks || ARRAY(
            SELECT s FROM unnest(%(added)s::text[]) AS s WHERE s <> ALL(o.sharks)),
        properties = jsonb_set(o.properties, '{{parts}}', (
            SELECT jsonb_agg(
                CASE WHEN part ->> 'id' = %(id)s::text
                     THEN jsonb_set(part, '{{sharks}}', (part -> 'sharks') || to_jsonb(ARRAY(
                         SELECT s FROM unnest(%(added)s::text[]) AS s
                         WHERE NOT (part -> 'sharks') @> jsonb_build_array(s))))
                     ELSE part END
                ORDER BY ordinal)
            FROM jsonb_array_elements(o.properties -> 'parts') WITH ORDINALITY
                 AS parts (part, ordinal)))
    WHERE o.owner = %(owner)s AND o.bucket_id = %(bucket_id)s AND o.name = %(name)s
      AND o.properties -> 'parts' @> jsonb_build_array(jsonb_build_object('id', %(id)s::text))
    RETURNING 1
), part AS (
    UPDATE {schema}.manta_bucket_upload_part p
    SET sharks = p.sharks || ARRAY(
        SELECT s FROM unnest(%(added)s::text[]) AS s WHERE s <> ALL(p.sharks))
    WHERE p.owner = %(owner)s AND p.bucket_id = %(bucket_id)s AND p.id = %(id)s
    RETURNING 1
)
SELECT (SELECT count(*) FROM version) + (SELECT count(*) FROM assembled)
       + (SELECT count(*) FROM part) AS updated
"""

# -- moving copies between nodes (on the object's vnode; docs/storage.md, "Node states") --------

# Names `new` instead of `old` among the sharks of `id`, wherever it is live (the three places
# LOCATE_UNDER_REPLICATED looks) and still names `old`, and counts the rows changed. As with
# ADD_SHARKS, each UPDATE re-checks its WHERE on the newest row version under the row's lock:
# a version replaced or deleted meanwhile is not touched (0), since the deletion record its
# replacement made names `old`, not `new`. `new` already named (a re-replicator put a copy
# there too) is not named twice. An assembled object's own sharks stay the union of its
# parts'.
REPLACE_SHARK = """
WITH version AS (
    UPDATE {schema}.manta_bucket_object o
    SET sharks = array_remove(o.sharks, %(old)s::text)
                 || ARRAY(SELECT %(new)s::text WHERE %(new)s::text <> ALL(o.sharks))
    WHERE o.owner = %(owner)s AND o.bucket_id = %(bucket_id)s AND o.name = %(name)s
      AND o.id = %(id)s AND %(old)s::text = ANY(o.sharks)
    RETURNING 1
), assembled AS (
    UPDATE {schema}.manta_bucket_object o
    SET properties = jsonb_set(o.properties, '{{parts}}', (
            SELECT jsonb_agg(
                CASE WHEN part ->> 'id' = %(id)s::text
                     THEN jsonb_set(part, '{{sharks}}', to_jsonb(
                         ARRAY(SELECT s FROM jsonb_array_elements_text(part -> 'sharks')
                                    WITH ORDINALITY AS kept (s, n)
                               WHERE s <> %(old)s::text ORDER BY n)
                         || ARRAY(SELECT %(new)s::text WHERE NOT
                                  (part -> 'sharks') @> jsonb_build_array(%(new)s::text))))
                     ELSE part END
                ORDER BY ordinal)
            FROM jsonb_array_elements(o.properties -> 'parts') WITH ORDINALITY
                 AS parts (part, ordinal))),
        sharks = ARRAY(
            SELECT DISTINCT CASE WHEN part ->> 'id' = %(id)s::text AND s = %(old)s::text
                                 THEN %(new)s::text ELSE s END
            FROM jsonb_array_elements(o.properties -> 'parts') AS part,
                 jsonb_array_elements_text(part -> 'sharks') AS s
            ORDER BY 1)
    WHERE o.owner = %(owner)s AND o.bucket_id = %(bucket_id)s AND o.name = %(name)s
      AND o.properties -> 'parts' @> jsonb_build_array(jsonb_build_object(
          'id', %(id)s::text, 'sharks', jsonb_build_array(%(old)s::text)))
    RETURNING 1
), part AS (
    UPDATE {schema}.manta_bucket_upload_part p
    SET sharks = array_remove(p.sharks, %(old)s::text)
                 || ARRAY(SELECT %(new)s::text WHERE %(new)s::text <> ALL(p.sharks))
    WHERE p.owner = %(owner)s AND p.bucket_id = %(bucket_id)s AND p.id = %(id)s
      AND %(old)s::text = ANY(p.sharks)
    RETURNING 1
)
SELECT (SELECT count(*) FROM version) + (SELECT count(*) FROM assembled)
       + (SELECT count(*) FROM part) AS updated
"""

# A dead node's copies, step 1 (one transaction with step 2): note every version or part of
# the vnode whose sharks name it beside another node, for the re-replicator. One named by
# the dead node alone is left as it is: no copy is left to restore it from, and it comes
# back if the node does.
NOTE_COPIES_ON_SHARK = """
INSERT INTO {schema}.manta_bucket_under_replicated (owner, bucket_id, name, id)
SELECT owner, bucket_id, name, id FROM {schema}.manta_bucket_object
WHERE %(shark)s::text = ANY(sharks) AND cardinality(sharks) > 1
  AND properties -> 'parts' IS NULL
UNION ALL
SELECT o.owner, o.bucket_id, o.name, (part ->> 'id')::uuid
FROM {schema}.manta_bucket_object o, jsonb_array_elements(o.properties -> 'parts') AS part
WHERE %(shark)s::text = ANY(o.sharks)
  AND (part -> 'sharks') @> jsonb_build_array(%(shark)s::text)
  AND jsonb_array_length(part -> 'sharks') > 1
UNION ALL
SELECT owner, bucket_id, name, id FROM {schema}.manta_bucket_upload_part
WHERE %(shark)s::text = ANY(sharks) AND cardinality(sharks) > 1
ON CONFLICT DO NOTHING
"""

# Step 2: the dead node leaves the sharks of every noted version or part that names it
# beside another node; the re-replicator then finds each short of copies and adds them. A
# row written after step 1 has no note and keeps the shark (running mark-dead again takes
# it), so nothing loses a copy without a note saying so.
DROP_NOTED_SHARK = """
WITH noted AS (
    SELECT id FROM {schema}.manta_bucket_under_replicated
), version AS (
    UPDATE {schema}.manta_bucket_object o
    SET sharks = array_remove(o.sharks, %(shark)s::text)
    WHERE %(shark)s::text = ANY(o.sharks) AND cardinality(o.sharks) > 1
      AND o.properties -> 'parts' IS NULL AND o.id IN (SELECT id FROM noted)
    RETURNING 1
), assembled AS (
    UPDATE {schema}.manta_bucket_object o
    SET properties = jsonb_set(o.properties, '{{parts}}', (
            SELECT jsonb_agg(
                CASE WHEN (part -> 'sharks') @> jsonb_build_array(%(shark)s::text)
                          AND jsonb_array_length(part -> 'sharks') > 1
                          AND (part ->> 'id')::uuid IN (SELECT id FROM noted)
                     THEN jsonb_set(part, '{{sharks}}', (part -> 'sharks') - %(shark)s::text)
                     ELSE part END
                ORDER BY ordinal)
            FROM jsonb_array_elements(o.properties -> 'parts') WITH ORDINALITY
                 AS parts (part, ordinal))),
        sharks = ARRAY(
            SELECT DISTINCT s
            FROM jsonb_array_elements(o.properties -> 'parts') AS part,
                 jsonb_array_elements_text(part -> 'sharks') AS s
            WHERE NOT (s = %(shark)s::text AND jsonb_array_length(part -> 'sharks') > 1
                       AND (part ->> 'id')::uuid IN (SELECT id FROM noted))
            ORDER BY 1)
    WHERE %(shark)s::text = ANY(o.sharks) AND o.properties -> 'parts' IS NOT NULL
      AND EXISTS (
          SELECT 1 FROM jsonb_array_elements(o.properties -> 'parts') AS part
          WHERE (part -> 'sharks') @> jsonb_build_array(%(shark)s::text)
            AND jsonb_array_length(part -> 'sharks') > 1
            AND (part ->> 'id')::uuid IN (SELECT id FROM noted))
    RETURNING 1
), part AS (
    UPDATE {schema}.manta_bucket_upload_part p
    SET sharks = array_remove(p.sharks, %(shark)s::text)
    WHERE %(shark)s::text = ANY(p.sharks) AND cardinality(p.sharks) > 1
      AND p.id IN (SELECT id FROM noted)
    RETURNING 1
)
SELECT (SELECT count(*) FROM version) + (SELECT count(*) FROM assembled)
       + (SELECT count(*) FROM part) AS dropped
"""

# Step 3: deletion records forget the dead node. Its blocks can never be deleted, and GC,
# which keeps a record until every node it names has deleted the blocks, would keep these
# for ever (and `shoal node remove` would wait for them).
DROP_SHARK_FROM_RECORDS = """
UPDATE {schema}.manta_bucket_deleted_object r
SET sharks = array_remove(r.sharks, %(shark)s::text),
    properties = CASE WHEN r.properties -> 'parts' IS NULL THEN r.properties
        ELSE jsonb_set(r.properties, '{{parts}}', (
            SELECT jsonb_agg(jsonb_set(part, '{{sharks}}', (part -> 'sharks') - %(shark)s::text)
                             ORDER BY ordinal)
            FROM jsonb_array_elements(r.properties -> 'parts') WITH ORDINALITY
                 AS parts (part, ordinal)))
        END
WHERE %(shark)s::text = ANY(r.sharks)
"""

# How many rows of a vnode name a node: live objects (an assembled object's sharks are its
# parts'), open uploads' parts, and deletion records, whose blocks GC deletes from the node
# named (so a node must stay registered until they are collected); `sole`: of the live
# ones, those with no other copy.
ROWS_NAMING_SHARK_ARM = """
SELECT count(*) AS named,
       count(*) FILTER (WHERE live AND copies = 1) AS sole
FROM (
    SELECT true AS live, cardinality(sharks) AS copies FROM {schema}.manta_bucket_object
    WHERE %(shark)s::text = ANY(sharks)
    UNION ALL
    SELECT true, cardinality(sharks) FROM {schema}.manta_bucket_upload_part
    WHERE %(shark)s::text = ANY(sharks)
    UNION ALL
    SELECT false, cardinality(sharks) FROM {schema}.manta_bucket_deleted_object
    WHERE %(shark)s::text = ANY(sharks)
) AS naming
"""

ROWS_NAMING_SHARK = """
SELECT coalesce(sum(named), 0)::bigint AS named, coalesce(sum(sole), 0)::bigint AS sole
FROM ({arms}) AS counts
"""

# Which vnodes of a shard hold notes (a pass reads only those), and how many in all.
UNDER_REPLICATED_VNODE_ARM = """
(SELECT {vnode} AS vnode FROM {schema}.manta_bucket_under_replicated LIMIT 1)
"""

UNDER_REPLICATED_COUNT_ARM = """
SELECT count(*) AS notes FROM {schema}.manta_bucket_under_replicated
"""

UNDER_REPLICATED_COUNT = "SELECT coalesce(sum(notes), 0)::bigint AS notes FROM ({arms}) AS counts"

# -- bucket lifecycle (catalog shard) ---------------------------------------------------------

PUT_LIFECYCLE = """
INSERT INTO shoal.bucket_lifecycle (bucket_id, owner, bucket, rules)
VALUES (%(bucket_id)s, %(owner)s, %(bucket)s, %(rules)s)
ON CONFLICT (bucket_id) DO UPDATE SET rules = EXCLUDED.rules, updated = current_timestamp
"""

GET_LIFECYCLE = "SELECT rules FROM shoal.bucket_lifecycle WHERE bucket_id = %(bucket_id)s"

DELETE_LIFECYCLE = "DELETE FROM shoal.bucket_lifecycle WHERE bucket_id = %(bucket_id)s"

ALL_LIFECYCLES = "SELECT bucket_id, owner, bucket, rules FROM shoal.bucket_lifecycle"

# -- bucket CORS (catalog shard) --------------------------------------------------------------

PUT_CORS = """
INSERT INTO shoal.bucket_cors (bucket_id, owner, bucket, rules)
VALUES (%(bucket_id)s, %(owner)s, %(bucket)s, %(rules)s)
ON CONFLICT (bucket_id) DO UPDATE SET rules = EXCLUDED.rules, updated = current_timestamp
"""

GET_CORS = "SELECT rules FROM shoal.bucket_cors WHERE bucket_id = %(bucket_id)s"

DELETE_CORS = "DELETE FROM shoal.bucket_cors WHERE bucket_id = %(bucket_id)s"

# -- bucket tags (catalog shard) ---------------------------------------------------------------

PUT_BUCKET_TAGS = """
INSERT INTO shoal.bucket_tagging (bucket_id, tags) VALUES (%(bucket_id)s, %(tags)s)
ON CONFLICT (bucket_id) DO UPDATE SET tags = EXCLUDED.tags, updated = current_timestamp
"""

GET_BUCKET_TAGS = "SELECT tags FROM shoal.bucket_tagging WHERE bucket_id = %(bucket_id)s"

DELETE_BUCKET_TAGS = "DELETE FROM shoal.bucket_tagging WHERE bucket_id = %(bucket_id)s"

# -- bucket inventory configurations (catalog shard) -------------------------------------------

# The puts of one bucket's configurations take turns (a transaction lock keyed by the
# bucket incarnation): PUT_INVENTORY counts the others in its own snapshot, and two puts
# counting at once could both see room for one more.
LOCK_BUCKET_INVENTORY = "SELECT pg_advisory_xact_lock(5456036, hashtext(%(bucket_id)s::text))"

# Adds or replaces one configuration; adds nothing (no row returned) when the bucket already
# has `limit` others. A replaced configuration keeps when it was last delivered.
PUT_INVENTORY = """
INSERT INTO shoal.bucket_inventory (bucket_id, id, owner, bucket, configuration)
SELECT %(bucket_id)s, %(id)s, %(owner)s, %(bucket)s, %(configuration)s
WHERE (
    SELECT count(*) FROM shoal.bucket_inventory
    WHERE bucket_id = %(bucket_id)s AND id <> %(id)s
) < %(limit)s
ON CONFLICT (bucket_id, id) DO UPDATE
SET configuration = EXCLUDED.configuration, updated = current_timestamp
RETURNING id
"""

GET_INVENTORY = """
SELECT configuration FROM shoal.bucket_inventory WHERE bucket_id = %(bucket_id)s AND id = %(id)s
"""

# A page of a bucket's configurations in id order, after `after`.
LIST_INVENTORIES = """
SELECT configuration FROM shoal.bucket_inventory
WHERE bucket_id = %(bucket_id)s AND id > %(after)s
ORDER BY id LIMIT %(limit)s
"""

DELETE_INVENTORY = """
DELETE FROM shoal.bucket_inventory WHERE bucket_id = %(bucket_id)s AND id = %(id)s RETURNING id
"""

# Every configuration, with the database's clock for judging which are due.
ALL_INVENTORIES = """
SELECT bucket_id, owner, bucket, id, configuration, delivered, current_timestamp AS now
FROM shoal.bucket_inventory ORDER BY bucket, id
"""

MARK_INVENTORY_DELIVERED = """
UPDATE shoal.bucket_inventory SET delivered = %(delivered)s
WHERE bucket_id = %(bucket_id)s AND id = %(id)s
"""

# -- bucket names against bucket rows (`shoal db check`: claims.py) ---------------------------

ALL_BUCKET_CLAIMS = "SELECT name, owner, bucket_id FROM shoal.bucket_name"

ALL_BUCKETS_ARM = "SELECT id, owner, name FROM {schema}.manta_bucket"

ALL_BUCKETS_MERGE = "SELECT id, owner, name FROM ({arms}) AS buckets"

# Which of the incarnations `ids` a vnode of the shard recorded as deleted.
DELETED_BUCKETS_ARM = """
SELECT id FROM {schema}.manta_bucket_deleted_bucket WHERE id = ANY(%(ids)s)
"""

DELETED_BUCKETS_MERGE = "SELECT DISTINCT id FROM ({arms}) AS deleted"

# Does the shard answer? (a gateway's readiness)
PING = "SELECT 1"
# A commit that writes WAL and so waits, as every write's does, for the WAL's flush and for a
# synchronous standby: the commit probe (ShardPool.probe_commits). A transactional logical
# message touches no table; a statement that only takes a transaction id commits without
# waiting for either.
COMMIT_PROBE = "SELECT pg_logical_emit_message(true, 'shoal-commit-probe', '')"

# -- bucket canned ACLs (catalog shard; no row: private) --------------------------------------

PUT_BUCKET_ACL = """
INSERT INTO shoal.bucket_acl (bucket_id, acl) VALUES (%(bucket_id)s, %(acl)s)
ON CONFLICT (bucket_id) DO UPDATE SET acl = EXCLUDED.acl, updated = current_timestamp
"""

GET_BUCKET_ACL = "SELECT acl FROM shoal.bucket_acl WHERE bucket_id = %(bucket_id)s"

DELETE_BUCKET_ACL = "DELETE FROM shoal.bucket_acl WHERE bucket_id = %(bucket_id)s"

# -- pipeline run history (catalog shard) ------------------------------------------------------

RECORD_PIPELINE_RUN = """
INSERT INTO shoal.pipeline_run (job, started, outcome, figures, problems, error, output)
VALUES (%(job)s, %(started)s, %(outcome)s, %(figures)s, %(problems)s, %(error)s, %(output)s)
RETURNING id
"""

PIPELINE_RUN_COLUMNS = "id, job, started, finished, outcome, figures, problems, error, output"

# Newest first; every job when %(job)s is NULL.
PIPELINE_RUNS = f"""
SELECT {PIPELINE_RUN_COLUMNS} FROM shoal.pipeline_run
WHERE %(job)s::text IS NULL OR job = %(job)s
ORDER BY id DESC LIMIT %(limit)s
"""

# The newest run of each job (pipeline_run_job_idx).
LAST_PIPELINE_RUN_PER_JOB = f"""
SELECT DISTINCT ON (job) {PIPELINE_RUN_COLUMNS} FROM shoal.pipeline_run ORDER BY job, id DESC
"""

# -- the pipeline's schedule (shoal.pipeline.schedule), on the catalog shard ------------------

# When the cluster was made: a job that never ran counts its moments from then.
CLUSTER_MADE = "SELECT min(applied_at) FROM shoal.schema_migrations"

# Held by the `serve` whose scheduler runs a job, for the length of the run (session level:
# it ends with the connection, should that `serve` die).
TRY_SCHEDULER_LOCK = "SELECT pg_try_advisory_lock(%(key)s)"

SCHEDULER_UNLOCK = "SELECT pg_advisory_unlock(%(key)s)"

# -- the census (admin API, metrics, `shoal status`): cheap reads of the whole cluster -------

# Every column of the registry (a column added by a later migration comes along), with
# liveness and the heartbeat's age by the database clock.
CENSUS_NODES = """
SELECT n.*, n.heartbeat > current_timestamp - %(deadline)s::interval AS alive,
       extract(epoch FROM current_timestamp - n.heartbeat)::float8 AS heartbeat_age_seconds
FROM shoal.storage_node n
ORDER BY n.name
"""

ALL_BUCKETS_ARM = "SELECT id, owner, name, created FROM {schema}.manta_bucket"

ALL_BUCKETS = "SELECT id, owner, name, created FROM ({arms}) AS buckets ORDER BY owner, name"

# The windows of each deleted table in some vnode schemas, and the rows the statistics count
# in them (pg_stat_user_tables.n_live_tup: kept up to date by inserts, deletes and truncates;
# nothing is scanned).
GC_WINDOW_STATISTICS = """
SELECT p.relname AS parent, count(*) AS windows,
       coalesce(sum(s.n_live_tup), 0)::bigint AS estimated_rows
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_class p ON p.oid = i.inhparent
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.relkind = 'r' AND n.nspname = ANY(%(schemas)s)
GROUP BY p.relname
"""

# The oldest deletion of a vnode: one probe of the deleted_at index of each window.
GC_OLDEST_ARM = """
SELECT min(deleted_at) AS oldest FROM {schema}.manta_bucket_deleted_object
UNION ALL
SELECT min(deleted_at) FROM {schema}.manta_bucket_deleted_bucket
"""

GC_OLDEST = "SELECT min(oldest) AS oldest FROM ({arms}) AS oldest"

# A sample of a vnode's deletion records' sizes: a share of the windows' pages.
GC_SIZE_SAMPLE_ARM = """
SELECT count(*) AS records, coalesce(sum(content_length), 0) AS bytes
FROM {schema}.manta_bucket_deleted_object TABLESAMPLE SYSTEM (%(percent)s)
"""

GC_SIZE_SAMPLE = """
SELECT sum(records)::bigint AS records, sum(bytes)::bigint AS bytes FROM ({arms}) AS sample
"""

# -- shards and vnode moves (catalog shard; moves.py) ------------------------------------------

ADDED_SHARDS = "SELECT name, dsn_sealed FROM shoal.shard ORDER BY added, name"

ADD_SHARD = """
INSERT INTO shoal.shard (name, dsn_sealed) VALUES (%(name)s, %(dsn_sealed)s)
ON CONFLICT (name) DO UPDATE SET dsn_sealed = EXCLUDED.dsn_sealed
"""

REMOVE_SHARD = "DELETE FROM shoal.shard WHERE name = %(name)s"

RING_VERSIONS = """
SELECT r.version, r.created, count(v.vnode) AS vnodes
FROM shoal.ring r LEFT JOIN shoal.ring_vnode v USING (version)
GROUP BY r.version, r.created ORDER BY r.version DESC LIMIT %(limit)s
"""

# A new ring version: the latest one with `vnode` placed on `shard`.
NEXT_RING = """
INSERT INTO shoal.ring (version, vnodes)
SELECT version + 1, vnodes FROM shoal.ring ORDER BY version DESC LIMIT 1
RETURNING version
"""

COPY_RING_VNODES = """
INSERT INTO shoal.ring_vnode (version, vnode, shard)
SELECT %(version)s, vnode, CASE WHEN vnode = %(vnode)s THEN %(shard)s ELSE shard END
FROM shoal.ring_vnode WHERE version = %(version)s - 1
"""

START_MOVE = """
INSERT INTO shoal.vnode_move (vnode, source, target, step)
VALUES (%(vnode)s, %(source)s, %(target)s, 'copying')
RETURNING id
"""

MOVE_STEP = """
UPDATE shoal.vnode_move
SET step = %(step)s, updated = current_timestamp,
    fence_lsn = coalesce(%(fence_lsn)s::pg_lsn, fence_lsn),
    ring_version = coalesce(%(ring_version)s, ring_version),
    write_pause_seconds = coalesce(%(write_pause_seconds)s, write_pause_seconds)
WHERE id = %(id)s
"""

MOVE_COLUMNS = """
id, vnode, source, target, step, fence_lsn::text AS fence_lsn, ring_version,
write_pause_seconds, started, updated
"""

OPEN_MOVES = f"""
SELECT {MOVE_COLUMNS} FROM shoal.vnode_move WHERE step IN ('copying', 'fenced') ORDER BY id
"""

# Moves switched over whose source copy awaits its grace period.
SWITCHED_MOVES = f"""
SELECT {MOVE_COLUMNS}, updated < current_timestamp - %(grace)s AS grace_over
FROM shoal.vnode_move WHERE step = 'switched' ORDER BY id
"""

MOVING_VNODES = "SELECT vnode FROM shoal.vnode_move WHERE step IN ('copying', 'fenced')"

# Moves from or to a shard that are not over: open, or switched with the old copy kept.
MOVES_OF_SHARD = f"""
SELECT {MOVE_COLUMNS} FROM shoal.vnode_move
WHERE (source = %(name)s OR target = %(name)s) AND step IN ('copying', 'fenced', 'switched')
ORDER BY id
"""

# What a process that follows the ring notes at each poll and adoption; old rows (processes
# gone) are forgotten by the same statement.
NOTE_RING_READ = """
WITH forgotten AS (
    DELETE FROM shoal.ring_reader WHERE seen < current_timestamp - interval '1 day'
)
INSERT INTO shoal.ring_reader (process, ring_version) VALUES (%(process)s, %(version)s)
ON CONFLICT (process) DO UPDATE
SET ring_version = greatest(shoal.ring_reader.ring_version, excluded.ring_version),
    seen = current_timestamp
"""

# What a process that stops following the ring (its store closing) removes: it uses no ring
# any more, so it holds up no move's finish.
FORGET_RING_READER = """
DELETE FROM shoal.ring_reader WHERE process = %(process)s
"""

# The processes noted within `live` that still use a ring older than `version`.
RING_READERS_BEHIND = """
SELECT process FROM shoal.ring_reader
WHERE seen > current_timestamp - %(live)s AND ring_version < %(version)s
ORDER BY process
"""

# Errors of a move's subscription: a table that cannot be copied, a change it cannot apply.
SUBSCRIPTION_ERRORS = """
SELECT apply_error_count + sync_error_count FROM pg_stat_subscription_stats
WHERE subname = %(name)s
"""

RECENT_MOVES = f"SELECT {MOVE_COLUMNS} FROM shoal.vnode_move ORDER BY id DESC LIMIT %(limit)s"

# Only one mover at a time across the cluster (a session lock on the catalog shard, released
# when the mover's connection ends, by a crash too).
TRY_MOVER_LOCK = "SELECT pg_try_advisory_lock(%(key)s)"

MOVER_UNLOCK = "SELECT pg_advisory_unlock(%(key)s)"

# A vnode being moved belongs to its mover: the mover holds this advisory lock (exclusive, on
# the source shard, keyed by the vnode) from before its copy until its switch or roll-back.
# Every GC transaction on a vnode takes it shared first and, when it is not granted, leaves
# the vnode for a later pass; the mover's lock waits for the GC transactions in flight.
VNODE_MOVE_LOCK = "SELECT pg_advisory_lock(5456035, %(vnode)s)"

VNODE_MOVE_UNLOCK = "SELECT pg_advisory_unlock(5456035, %(vnode)s)"

GC_VNODE_LOCK = "SELECT pg_try_advisory_xact_lock_shared(5456035, %(vnode)s)"

# For what GC does outside a transaction (VACUUM): held by the session until unlocked.
GC_VNODE_SESSION_LOCK = "SELECT pg_try_advisory_lock_shared(5456035, %(vnode)s)"

GC_VNODE_SESSION_UNLOCK = "SELECT pg_advisory_unlock_shared(5456035, %(vnode)s)"

SCHEMA_EXISTS = "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %(schema)s)"

SCHEMAS_LIKE = "SELECT nspname FROM pg_namespace WHERE nspname LIKE %(pattern)s ORDER BY nspname"

# The tables of a schema, partitioned parents and their windows alike.
SCHEMA_TABLES = """
SELECT c.relname, c.relkind = 'p' AS partitioned, c.relispartition AS is_window
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p')
ORDER BY c.relname
"""

RENAME_MIGRATION_SCOPE = """
UPDATE shoal.schema_migrations SET scope = %(new)s WHERE scope = %(old)s
"""

FORGET_MIGRATION_SCOPE = "DELETE FROM shoal.schema_migrations WHERE scope = %(scope)s"

CURRENT_LSN = "SELECT pg_current_wal_lsn()::text"

SLOT_CONFIRMED = """
SELECT confirmed_flush_lsn >= %(lsn)s::pg_lsn FROM pg_replication_slots WHERE slot_name = %(slot)s
"""

SLOT_EXISTS = "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = %(slot)s)"

CREATE_SLOT = "SELECT pg_create_logical_replication_slot(%(slot)s, 'pgoutput')"

DROP_SLOT = "SELECT pg_drop_replication_slot(%(slot)s)"

PUBLICATION_EXISTS = "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = %(name)s)"

SUBSCRIPTION_EXISTS = "SELECT EXISTS (SELECT 1 FROM pg_subscription WHERE subname = %(name)s)"

# Tables of a subscription not yet copied and caught up ('r' is ready).
SUBSCRIPTION_UNSYNCED = """
SELECT count(*) FROM pg_subscription_rel r JOIN pg_subscription s ON s.oid = r.srsubid
WHERE s.subname = %(name)s AND r.srsubstate <> 'r'
"""

SUBSCRIPTION_TABLES = """
SELECT count(*) FROM pg_subscription_rel r JOIN pg_subscription s ON s.oid = r.srsubid
WHERE s.subname = %(name)s
"""

WAL_LEVEL = "SHOW wal_level"

SLOT_ACTIVE = "SELECT active FROM pg_replication_slots WHERE slot_name = %(slot)s"
