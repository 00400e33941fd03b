"""The DDL of every migration, by scope.

Three scopes, each with its own version sequence in `shoal.schema_migrations`:
  shard      on every shard: the hstore extension, Shoal's SQL helpers, the '/' directory
  catalog    on the catalog shard (the first configured): ring, accounts, keys, names, nodes
  vnode      in each `manta_bucket_<vnode>` schema, on the shard the ring gives that vnode

The four tables of RFD 149 appear exactly as named and typed there; every addition is listed
with its reason in docs/metadata.md. `{schema}` is replaced by the quoted vnode schema name,
`{vnode}` by the vnode's number.
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal.metadata.queries import DIRECTORY_OF_NAME, FILL_DIRECTORY, FILL_PREFIX_INDEX


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    ddl: str


@dataclass(frozen=True)
class Renumbered:
    """A migration whose number changed after it had landed: a scope that recorded it as
    `old_version` has it recorded as `version` before it is migrated (the DDL is the same)."""

    scope: str
    old_version: int
    name: str
    version: int


RENUMBERED = (Renumbered("catalog", 13, "ring readers", 12),)


# Functions and triggers are written CREATE OR REPLACE, once each: the migration that first
# made them and a later one that makes them again as they are now (for shards and vnodes that
# an earlier version migrated) share the text. A change to one of them is a new migration
# that applies it again, never an edit of what a landed migration ran
# (tests/unit/test_migrations.py).

# Shoal's listing helpers, on every shard.
LISTING_FUNCTIONS = """
-- The least string greater than every string starting with s (NULL: no bound).
-- Mirrors shoal.metadata.listing.successor; lets a delimiter listing jump over a common
-- prefix with one index probe.
CREATE OR REPLACE FUNCTION shoal.successor(s text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    n int := length(s);
    c int;
BEGIN
    WHILE n > 0 LOOP
        c := ascii(substr(s, n, 1));
        IF c < 1114111 THEN
            c := CASE WHEN c = 55295 THEN 57344 ELSE c + 1 END;  -- skip surrogates
            RETURN left(s, n - 1) || chr(c);
        END IF;
        n := n - 1;
    END LOOP;
    RETURN NULL;
END $$;

-- The common prefix a name rolls up into under (prefix, delimiter), or NULL.
-- Mirrors shoal.metadata.listing.common_prefix. Not STRICT, so the planner inlines it into
-- the listing's skip scan (a delimiter page took about a fifth less time than with a STRICT one).
CREATE OR REPLACE FUNCTION shoal.common_prefix(name text, prefix text, delimiter text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN delimiter = '' THEN NULL
        WHEN strpos(substr(name, length(prefix) + 1), delimiter) = 0 THEN NULL
        ELSE left(name, length(prefix) + strpos(substr(name, length(prefix) + 1), delimiter)
                        + length(delimiter) - 1)
    END
$$;
"""

# The '/' directory's functions, on every shard (the table: shard migration 2).
DIRECTORY_FUNCTIONS = """
-- The directory rows of a name: one (parent, segment) per '/' in it, root first ("a/b/c"
-- gives ("", "a/") and ("a/", "b/")), then (its directory, ''). With `lock_bucket` and
-- `lock_vnode`, the shared advisory lock of each common prefix (of the first 8: a deeper one
-- is held by its ancestor 8 levels down, so that no name takes more than 8) is taken first,
-- root first: the order of every writer, so that none waits for another in a cycle; all are
-- held before the first row is returned (a PL/pgSQL set function returns its rows at its
-- end). PL/pgSQL with ROWS 4, not an inlined SQL function: a statement over it then costs the
-- same to the planner whatever the name, so the triggers' statements keep one generic plan
-- instead of being planned per row.
CREATE OR REPLACE FUNCTION shoal.directory_levels(
    object_name text, lock_bucket uuid DEFAULT NULL, lock_vnode int DEFAULT NULL,
    OUT parent text, OUT segment text)
RETURNS SETOF record LANGUAGE plpgsql VOLATILE ROWS 4 AS $$
DECLARE
    done int := 0;
    cut int;
    depth int := 0;
BEGIN
    LOOP
        cut := strpos(substr(object_name, done + 1), '/');
        EXIT WHEN cut = 0;
        depth := depth + 1;
        IF lock_bucket IS NOT NULL AND depth <= 8 THEN
            PERFORM pg_advisory_xact_lock_shared(
                shoal.directory_lock(lock_bucket, left(object_name, done + cut), lock_vnode));
        END IF;
        parent := left(object_name, done);
        segment := substr(object_name, done + 1, cut);
        RETURN NEXT;
        done := done + cut;
    END LOOP;
    parent := left(object_name, done);
    segment := '';
    RETURN NEXT;
END $$;

-- The advisory lock that orders the writes of a vnode under one common prefix: a write that
-- makes a name new holds it shared, a delete holds it exclusively while it checks whether
-- its common prefixes still hold names (the vnodes' directory triggers).
CREATE OR REPLACE FUNCTION shoal.directory_lock(bucket_id uuid, common_prefix text, vnode int)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended(bucket_id::text || common_prefix, vnode)
$$;
"""

# The vnode's functions and triggers that keep the shard's '/' directory (vnode migration 5).
DIRECTORY_TRIGGERS = (
    """
-- A name new to the vnode: its rows, each common prefix's lock taken shared first (no new
-- name waits for another), so that a delete that held one exclusively has committed, and a
-- row it removed is added again.
--
-- Fired BEFORE the row only by logical replication's apply on a vnode's new shard (below),
-- which is then the vnode's one writer: no locks, and no queued event per row of a copy that
-- may hold millions (a lock per prefix held to the copy's end could fill the lock table).
CREATE OR REPLACE FUNCTION {schema}.directory_add_name() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO shoal.bucket_directory (owner, bucket_id, parent, segment, vnode)
    SELECT NEW.owner, NEW.bucket_id, level.parent, level.segment, {vnode}
    FROM shoal.directory_levels(
        NEW.name, CASE WHEN TG_WHEN = 'AFTER' THEN NEW.bucket_id END, {vnode}) AS level
    ON CONFLICT DO NOTHING;
    RETURN NEW;
END $$;

-- Names gone from the vnode: the locks of their common prefixes, exclusively, in one order
-- (by common prefix: each writer takes its locks in name order, so none waits for another in
-- a cycle); then, in a statement of its own and so with a snapshot taken after the locks (READ
-- COMMITTED), the rows of the common prefixes and directories under which the vnode holds no
-- name any more go, each checked once however many of its names went. A new name under one
-- of them either committed before (it is seen) or waits for this transaction and adds its
-- row again. Generic plans: the arrays' sizes would otherwise have every call planned.
-- Without `take_locks` (replication's apply, the vnode's one writer) no lock is taken.
CREATE OR REPLACE FUNCTION {schema}.directory_forget(
    owners uuid[], bucket_ids uuid[], names text[], take_locks boolean)
RETURNS void LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    IF take_locks AND current_setting('transaction_isolation') <> 'read committed' THEN
        -- The check below must see what committed before the locks were had.
        RAISE EXCEPTION 'object rows are deleted in READ COMMITTED transactions only';
    END IF;
    PERFORM pg_advisory_xact_lock(shoal.directory_lock(prefix.bucket_id, prefix.path, {vnode}))
    FROM (SELECT DISTINCT gone.bucket_id, level.parent || level.segment AS path
          FROM unnest(bucket_ids, names) AS gone(bucket_id, name),
               shoal.directory_levels(gone.name) AS level
          WHERE level.segment <> '' AND take_locks
            -- The first 8 levels, as new names lock them (shoal.directory_levels).
            AND length(level.parent) - length(replace(level.parent, '/', '')) < 8) AS prefix
    ORDER BY prefix.path, prefix.bucket_id;
    DELETE FROM shoal.bucket_directory AS entry
    USING (SELECT gone.owner, gone.bucket_id, level.parent, level.segment,
                  max(gone.name COLLATE "C") AS last_gone
           FROM unnest(owners, bucket_ids, names) AS gone(owner, bucket_id, name),
                shoal.directory_levels(gone.name) AS level
           WHERE level.parent <> '' OR level.segment <> ''
           GROUP BY 1, 2, 3, 4) AS level
    WHERE entry.owner = level.owner AND entry.bucket_id = level.bucket_id
      AND entry.parent = level.parent AND entry.segment = level.segment
      AND entry.vnode = {vnode}
      -- Looked for after the last name gone first, then before it: names deleted in order
      -- leave their index entries before it, which a look from the start would step over.
      AND CASE
          WHEN level.segment <> '' THEN NOT EXISTS (
              SELECT FROM {schema}.manta_bucket_object AS o
              WHERE o.owner = level.owner AND o.bucket_id = level.bucket_id
                AND o.name > level.last_gone
                AND o.name < level.parent || left(level.segment, -1) || '0')
            AND NOT EXISTS (
              SELECT FROM {schema}.manta_bucket_object AS o
              WHERE o.owner = level.owner AND o.bucket_id = level.bucket_id
                AND o.name >= level.parent || level.segment AND o.name < level.last_gone)
          -- A directory's own row, under the lock of the directory as a common prefix.
          ELSE NOT EXISTS (
              SELECT FROM {schema}.manta_bucket_object AS o
              WHERE o.owner = level.owner AND o.bucket_id = level.bucket_id
                AND """
    + DIRECTORY_OF_NAME
    + """ = level.parent AND o.name > level.last_gone)
            AND NOT EXISTS (
              SELECT FROM {schema}.manta_bucket_object AS o
              WHERE o.owner = level.owner AND o.bucket_id = level.bucket_id
                AND """
    + DIRECTORY_OF_NAME
    + """ = level.parent AND o.name < level.last_gone)
      END;
END $$;

-- Whether another name of the directory of `gone_name` is on the vnode, and stays until this
-- transaction ends: one is locked FOR KEY SHARE, which its delete would wait for (SKIP
-- LOCKED: not one that a delete in flight holds). Then the directory, and every common prefix
-- above it, keeps a name, and the delete of `gone_name` has no row to remove and takes no
-- advisory lock: deletes in one directory do not wait for each other. Looked for after the
-- name first, then before it (names deleted in order leave dead entries before it).
CREATE OR REPLACE FUNCTION {schema}.directory_kept(
    kept_owner uuid, kept_bucket_id uuid, gone_name text)
RETURNS boolean LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    PERFORM FROM {schema}.manta_bucket_object
    WHERE owner = kept_owner AND bucket_id = kept_bucket_id
      AND """
    + DIRECTORY_OF_NAME
    + """ = left(gone_name, length(gone_name) + 1 - strpos(reverse(gone_name), '/'))
      AND name > gone_name
    ORDER BY """
    + DIRECTORY_OF_NAME
    + """, name LIMIT 1 FOR KEY SHARE SKIP LOCKED;
    IF FOUND THEN
        RETURN true;
    END IF;
    PERFORM FROM {schema}.manta_bucket_object
    WHERE owner = kept_owner AND bucket_id = kept_bucket_id
      AND """
    + DIRECTORY_OF_NAME
    + """ = left(gone_name, length(gone_name) + 1 - strpos(reverse(gone_name), '/'))
      AND name < gone_name
    ORDER BY """
    + DIRECTORY_OF_NAME
    + """ DESC, name DESC LIMIT 1 FOR KEY SHARE SKIP LOCKED;
    RETURN FOUND;
END $$;

-- Per statement, not per row: a statement deleting many names of one directory looks for a
-- name it keeps once, from the last one deleted, and checks each common prefix once (per
-- row, each look would step over the rows deleted before it). Names without a '/', and names
-- whose directory keeps another, need nothing.
CREATE OR REPLACE FUNCTION {schema}.directory_remove_names() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    directory record;
    gone_here int;
    owners uuid[] := '{{}}';
    bucket_ids uuid[] := '{{}}';
    names text[] := '{{}}';
BEGIN
    FOR directory IN
        SELECT owner, bucket_id, max(name COLLATE "C") AS last_gone,
               array_agg(name) AS names_gone
        FROM gone WHERE strpos(name, '/') > 0
        GROUP BY owner, bucket_id, left(name, length(name) + 1 - strpos(reverse(name), '/'))
    LOOP
        IF NOT {schema}.directory_kept(directory.owner, directory.bucket_id, directory.last_gone)
        THEN
            gone_here := cardinality(directory.names_gone);
            owners := owners || array_fill(directory.owner, ARRAY[gone_here]);
            bucket_ids := bucket_ids || array_fill(directory.bucket_id, ARRAY[gone_here]);
            names := names || directory.names_gone;
        END IF;
    END LOOP;
    IF cardinality(names) > 0 THEN
        PERFORM {schema}.directory_forget(owners, bucket_ids, names, true);
    END IF;
    RETURN NULL;
END $$;

-- Per row, for logical replication's apply on a vnode's new shard, which fires row triggers
-- only (ENABLE REPLICA: there, and only there).
CREATE OR REPLACE FUNCTION {schema}.directory_remove_name() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {schema}.directory_forget(
        ARRAY[OLD.owner], ARRAY[OLD.bucket_id], ARRAY[OLD.name::text], false);
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS directory_add_name ON {schema}.manta_bucket_object;
CREATE TRIGGER directory_add_name AFTER INSERT ON {schema}.manta_bucket_object
    FOR EACH ROW EXECUTE FUNCTION {schema}.directory_add_name();
DROP TRIGGER IF EXISTS directory_add_applied_name ON {schema}.manta_bucket_object;
CREATE TRIGGER directory_add_applied_name BEFORE INSERT ON {schema}.manta_bucket_object
    FOR EACH ROW EXECUTE FUNCTION {schema}.directory_add_name();
DROP TRIGGER IF EXISTS directory_remove_names ON {schema}.manta_bucket_object;
CREATE TRIGGER directory_remove_names AFTER DELETE ON {schema}.manta_bucket_object
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.directory_remove_names();
DROP TRIGGER IF EXISTS directory_remove_name ON {schema}.manta_bucket_object;
CREATE TRIGGER directory_remove_name AFTER DELETE ON {schema}.manta_bucket_object
    FOR EACH ROW WHEN (strpos(OLD.name, '/') > 0)
    EXECUTE FUNCTION {schema}.directory_remove_name();
ALTER TABLE {schema}.manta_bucket_object ENABLE REPLICA TRIGGER directory_add_applied_name;
ALTER TABLE {schema}.manta_bucket_object ENABLE REPLICA TRIGGER directory_remove_name;
"""
)

SHARD_MIGRATIONS = (
    Migration(
        1,
        "hstore and listing helpers",
        """
CREATE EXTENSION IF NOT EXISTS hstore;

CREATE TABLE shoal.settings (
    key text PRIMARY KEY,
    value text NOT NULL
);

"""
        + LISTING_FUNCTIONS,
    ),
    Migration(
        2,
        "the '/' directory",
        """
-- The '/' directory of the buckets whose names the shard's vnodes hold (docs/metadata.md,
-- "The '/' directory"), kept exact by the vnodes' triggers in the transaction of each write.
-- A row (parent, segment, vnode), segment ending in '/': vnode holds a name under
-- parent || segment. A row (parent, '', vnode): vnode holds a name whose directory is parent
-- (for the root, parent '': has held one; that row goes with the bucket).
CREATE TABLE shoal.bucket_directory (
    owner uuid NOT NULL,
    bucket_id uuid NOT NULL,
    parent text COLLATE "C" NOT NULL,
    segment text COLLATE "C" NOT NULL,
    vnode int NOT NULL,

    PRIMARY KEY (owner, bucket_id, parent, segment, vnode)
);

"""
        + DIRECTORY_FUNCTIONS,
    ),
    Migration(
        3,
        "Shoal's functions as they are now",
        """
-- For shards whose migrations 1 and 2 made earlier versions of these functions: the ones
-- each version of Shoal calls are made again, and the signatures no version calls any more go
-- (beside today's shoal.directory_levels, with its defaults, another one would make calls
-- ambiguous).
DROP FUNCTION IF EXISTS shoal.directory_levels(text);
DROP FUNCTION IF EXISTS shoal.directory_levels(text, uuid, int, boolean);
DROP FUNCTION IF EXISTS shoal.directory_levels_locked(uuid, text, int, boolean);
"""
        + LISTING_FUNCTIONS
        + DIRECTORY_FUNCTIONS,
    ),
)

CATALOG_MIGRATIONS = (
    Migration(
        1,
        "ring, accounts, bucket names, storage nodes",
        """
CREATE TABLE shoal.ring (
    version int PRIMARY KEY,
    vnodes int NOT NULL CHECK (vnodes > 0),
    created timestamptz DEFAULT current_timestamp NOT NULL
);

CREATE TABLE shoal.ring_vnode (
    version int NOT NULL REFERENCES shoal.ring (version),
    vnode int NOT NULL,
    shard text NOT NULL,
    PRIMARY KEY (version, vnode)
);

CREATE TABLE shoal.account (
    id uuid PRIMARY KEY,
    name text COLLATE "C" NOT NULL UNIQUE,
    created timestamptz DEFAULT current_timestamp NOT NULL
);

CREATE TABLE shoal.access_key (
    access_key_id text PRIMARY KEY,
    account_id uuid NOT NULL REFERENCES shoal.account (id),
    secret_encrypted bytea NOT NULL,
    created timestamptz DEFAULT current_timestamp NOT NULL,
    revoked timestamptz
);
CREATE INDEX access_key_account_idx ON shoal.access_key (account_id);

-- S3 bucket names are global; RFD 149 keys buckets by (owner, name). This table claims a
-- name for one owner across the whole ring.
CREATE TABLE shoal.bucket_name (
    name text COLLATE "C" PRIMARY KEY,
    owner uuid NOT NULL,
    bucket_id uuid NOT NULL
);

CREATE TABLE shoal.storage_node (
    name text PRIMARY KEY,
    datacenter text NOT NULL,
    url text NOT NULL,
    capacity_bytes bigint,
    free_bytes bigint,
    heartbeat timestamptz,
    registered timestamptz DEFAULT current_timestamp NOT NULL
);
""",
    ),
    Migration(
        2,
        "garbage collection runs",
        """
-- One row per GC run (daemon or pipeline), for `shoal gc status`.
CREATE TABLE shoal.gc_run (
    id bigserial PRIMARY KEY,
    kind text NOT NULL,
    leeway interval NOT NULL,
    started timestamptz NOT NULL,
    finished timestamptz DEFAULT current_timestamp NOT NULL,
    records_found bigint NOT NULL,
    records_reclaimed bigint NOT NULL,
    records_failed bigint NOT NULL,
    blocks_deleted bigint NOT NULL,
    bytes_reclaimed bigint NOT NULL,
    windows_dropped int NOT NULL
);
""",
    ),
    Migration(
        3,
        "bucket lifecycle configurations",
        """
-- S3 lifecycle rules of a bucket incarnation, as JSON (the pipeline's lifecycle job reads it).
CREATE TABLE shoal.bucket_lifecycle (
    bucket_id uuid PRIMARY KEY,
    owner uuid NOT NULL,
    bucket text COLLATE "C" NOT NULL,
    rules jsonb NOT NULL,
    updated timestamptz DEFAULT current_timestamp NOT NULL
);
""",
    ),
    Migration(
        4,
        "bucket CORS configurations",
        """
-- S3 CORS rules of a bucket incarnation, as JSON (the gateway answers preflights from them).
CREATE TABLE shoal.bucket_cors (
    bucket_id uuid PRIMARY KEY,
    owner uuid NOT NULL,
    bucket text COLLATE "C" NOT NULL,
    rules jsonb NOT NULL,
    updated timestamptz DEFAULT current_timestamp NOT NULL
);
""",
    ),
    Migration(
        5,
        "bucket tags",
        """
-- The tags of a bucket incarnation (PutBucketTagging), as a JSON map of key to value.
CREATE TABLE shoal.bucket_tagging (
    bucket_id uuid PRIMARY KEY,
    tags jsonb NOT NULL,
    updated timestamptz DEFAULT current_timestamp NOT NULL
);
""",
    ),
    Migration(
        6,
        "bucket canned ACLs",
        """
-- The canned ACL of a bucket incarnation other than private (no row: private).
CREATE TABLE shoal.bucket_acl (
    bucket_id uuid PRIMARY KEY,
    acl text NOT NULL,
    updated timestamptz DEFAULT current_timestamp NOT NULL
);
""",
    ),
    Migration(
        7,
        "pipeline run history",
        """
-- One row per run of a Spark pipeline job, whatever its outcome, for `shoal pipeline history`
-- and the admin API. `figures` is the job's summary; `error` the first line of what a failed
-- run raised.
CREATE TABLE shoal.pipeline_run (
    id bigserial PRIMARY KEY,
    job text NOT NULL,
    started timestamptz NOT NULL,
    finished timestamptz DEFAULT current_timestamp NOT NULL,
    outcome text NOT NULL CHECK (outcome IN ('ok', 'problems', 'failed')),
    figures jsonb NOT NULL,
    problems text[] NOT NULL,
    error text,
    output text
);
CREATE INDEX pipeline_run_job_idx ON shoal.pipeline_run (job, id);
""",
    ),
    Migration(
        8,
        "storage nodes' block counts and admin listeners",
        """
-- Both heartbeated: the blocks a node holds, and where its /ready and /metrics answer.
ALTER TABLE shoal.storage_node ADD COLUMN blocks bigint, ADD COLUMN admin_url text;
""",
    ),
    Migration(
        9,
        "added shards and vnode moves",
        """
-- Shards added with `shoal shard add`, beside those of the configuration. The DSN is sealed
-- with the credentials key (shoal/sealing.py): its password is never stored in clear.
CREATE TABLE shoal.shard (
    name text PRIMARY KEY,
    dsn_sealed bytea NOT NULL,
    added timestamptz DEFAULT current_timestamp NOT NULL
);

-- One row per move of a vnode between shards (shoal/metadata/moves.py). `step` is the last
-- step the mover recorded; the databases' own state (which schema exists where, the ring)
-- decides what a rerun resumes or rolls back.
CREATE TABLE shoal.vnode_move (
    id bigserial PRIMARY KEY,
    vnode int NOT NULL,
    source text NOT NULL,
    target text NOT NULL,
    step text NOT NULL CHECK (step IN ('copying', 'fenced', 'switched', 'done', 'rolled_back')),
    fence_lsn pg_lsn,
    ring_version int,
    write_pause_seconds double precision,
    started timestamptz DEFAULT current_timestamp NOT NULL,
    updated timestamptz DEFAULT current_timestamp NOT NULL
);
-- At most one unfinished move per vnode.
CREATE UNIQUE INDEX vnode_move_open_idx ON shoal.vnode_move (vnode)
WHERE step NOT IN ('done', 'rolled_back');
""",
    ),
    Migration(
        10,
        "storage node states",
        """
-- What an operator made of a node (docs/storage.md, "Node states"): `active` takes new
-- blocks; `draining` takes none and is emptied by `shoal pipeline rebalance`; `dead` is
-- never asked again and its copies are made anew elsewhere. A removed node has no row.
ALTER TABLE shoal.storage_node
    ADD COLUMN state text DEFAULT 'active' NOT NULL
        CHECK (state IN ('active', 'draining', 'dead'));
""",
    ),
    Migration(
        11,
        "bucket inventory configurations",
        """
-- The S3 Inventory configurations of a bucket incarnation (PutBucketInventoryConfiguration),
-- one row per configuration id, as JSON; `delivered` is when `shoal pipeline inventory` last
-- delivered its report (NULL: never), which decides when the next one is due.
CREATE TABLE shoal.bucket_inventory (
    bucket_id uuid NOT NULL,
    id text COLLATE "C" NOT NULL,
    owner uuid NOT NULL,
    bucket text COLLATE "C" NOT NULL,
    configuration jsonb NOT NULL,
    updated timestamptz DEFAULT current_timestamp NOT NULL,
    delivered timestamptz,
    PRIMARY KEY (bucket_id, id)
);
""",
    ),
    Migration(
        12,
        "ring readers",
        """
-- The ring version each process that follows the ring has loaded (shards.ShardSet), noted
-- at every poll and adoption. A moved vnode's old copy is dropped only once every process
-- noted lately has loaded the ring version of the move (moves.Mover.finish).
CREATE TABLE shoal.ring_reader (
    process text PRIMARY KEY,
    ring_version int NOT NULL,
    seen timestamptz DEFAULT current_timestamp NOT NULL
);
""",
    ),
)

VNODE_MIGRATIONS = (
    Migration(
        1,
        "RFD 149 tables, multipart uploads and parts",
        """
CREATE TABLE {schema}.manta_bucket (
    id uuid NOT NULL,
    name text COLLATE "C" NOT NULL,
    owner uuid NOT NULL,
    created timestamptz DEFAULT current_timestamp NOT NULL,

    PRIMARY KEY (owner, name)
);

-- fillfactor leaves room on each page so that overwrites stay HOT updates.
CREATE TABLE {schema}.manta_bucket_object (
    id uuid NOT NULL,
    name text COLLATE "C" NOT NULL,
    owner uuid NOT NULL,
    bucket_id uuid NOT NULL,
    created timestamptz DEFAULT current_timestamp NOT NULL,
    modified timestamptz DEFAULT current_timestamp NOT NULL,
    creator uuid,
    content_length bigint,
    content_md5 bytea,
    content_type text,
    headers hstore,
    roles uuid[],
    sharks text[],
    properties jsonb,

    PRIMARY KEY (owner, bucket_id, name)
) WITH (fillfactor = 80);

CREATE TABLE {schema}.manta_bucket_deleted_bucket (
    id uuid NOT NULL,
    name text COLLATE "C" NOT NULL,
    owner uuid NOT NULL,
    created timestamptz NOT NULL,
    deleted_at timestamptz DEFAULT current_timestamp NOT NULL
) PARTITION BY RANGE (deleted_at);

CREATE INDEX manta_bucket_deleted_bucket_id_idx
ON {schema}.manta_bucket_deleted_bucket (id);

CREATE INDEX manta_bucket_deleted_bucket_deleted_at_idx
ON {schema}.manta_bucket_deleted_bucket (deleted_at);

CREATE TABLE {schema}.manta_bucket_deleted_object (
    id uuid NOT NULL,
    name text COLLATE "C" NOT NULL,
    owner uuid NOT NULL,
    bucket_id uuid NOT NULL,
    created timestamptz NOT NULL,
    modified timestamptz NOT NULL,
    creator uuid,
    content_length bigint,
    content_md5 bytea,
    content_type text,
    headers hstore,
    roles uuid[],
    sharks text[],
    properties jsonb,
    deleted_at timestamptz DEFAULT current_timestamp NOT NULL
) PARTITION BY RANGE (deleted_at);

CREATE INDEX manta_bucket_deleted_object_id_idx
ON {schema}.manta_bucket_deleted_object (id);

CREATE INDEX manta_bucket_deleted_object_deleted_at_idx
ON {schema}.manta_bucket_deleted_object (deleted_at);

-- An open multipart upload lives on the vnode of the object it will become.
CREATE TABLE {schema}.manta_bucket_upload (
    id uuid NOT NULL,
    name text COLLATE "C" NOT NULL,
    owner uuid NOT NULL,
    bucket_id uuid NOT NULL,
    created timestamptz DEFAULT current_timestamp NOT NULL,
    creator uuid,
    content_type text,
    headers hstore,
    roles uuid[],
    properties jsonb,

    PRIMARY KEY (owner, bucket_id, name, id)
);

CREATE TABLE {schema}.manta_bucket_upload_part (
    owner uuid NOT NULL,
    bucket_id uuid NOT NULL,
    upload_id uuid NOT NULL,
    part_number int NOT NULL CHECK (part_number BETWEEN 1 AND 10000),
    id uuid NOT NULL,
    name text COLLATE "C" NOT NULL,
    created timestamptz DEFAULT current_timestamp NOT NULL,
    content_length bigint NOT NULL,
    content_md5 bytea NOT NULL,
    sharks text[],
    properties jsonb,

    PRIMARY KEY (owner, bucket_id, upload_id, part_number)
);
""",
    ),
    Migration(
        2,
        "small objects' data in their row",
        """
-- The bytes of an object no larger than the gateway's inline limit (docs/s3.md, "Small
-- objects"); NULL when the data is in blocks on storage nodes. EXTERNAL: a row past ~2 KB
-- keeps the bytes in the TOAST table, uncompressed, so that the heap keeps ~30 rows a page
-- for listings to read (kept in the row, 4 KiB objects made a listing page 2-2.6x slower).
ALTER TABLE {schema}.manta_bucket_object ADD COLUMN data bytea;
ALTER TABLE {schema}.manta_bucket_object ALTER COLUMN data SET STORAGE EXTERNAL;
""",
    ),
    Migration(
        3,
        "versions short of their copies",
        """
-- A version (or multipart part, by its id) written to fewer storage nodes than the target
-- number of copies, noted before its row commits; re-replication adds copies and removes the
-- note (docs/storage.md, "Re-replication"). Versions at full replication are never here.
CREATE TABLE {schema}.manta_bucket_under_replicated (
    owner uuid NOT NULL,
    bucket_id uuid NOT NULL,
    name text COLLATE "C" NOT NULL,
    id uuid NOT NULL,
    noted_at timestamptz DEFAULT current_timestamp NOT NULL,

    PRIMARY KEY (owner, bucket_id, name, id)
);

CREATE INDEX manta_bucket_under_replicated_noted_at_idx
ON {schema}.manta_bucket_under_replicated (noted_at);
""",
    ),
    Migration(
        4,
        "the '/' prefix index",
        """
-- Every '/' common prefix of the names of the vnode, as (parent, segment): "a/b/c" gives
-- ("", "a/") and ("a/", "b/"). Added by the write that makes a name new, never removed by a
-- delete: a listing checked each prefix it returned. Migration 5 replaces it with the shard's
-- '/' directory (docs/metadata.md, "The '/' directory").
CREATE TABLE {schema}.manta_bucket_prefix (
    owner uuid NOT NULL,
    bucket_id uuid NOT NULL,
    parent text COLLATE "C" NOT NULL,
    segment text COLLATE "C" NOT NULL,

    PRIMARY KEY (owner, bucket_id, parent, segment)
);
"""
        + FILL_PREFIX_INDEX
        + """;
-- The keys of each directory in order: a '/' listing's keys that roll up into no prefix.
CREATE INDEX manta_bucket_object_directory_idx ON {schema}.manta_bucket_object
    (owner, bucket_id, """
        + DIRECTORY_OF_NAME
        + """, name);
""",
    ),
    Migration(
        5,
        "the vnode's rows of the '/' directory",
        """
-- The vnode's rows of the shard's '/' directory (shard migration 2) follow its names, in the
-- transaction of each write; ENABLE ALWAYS: also as logical replication applies a moving
-- vnode's rows on its new shard (docs/metadata.md, "The '/' directory").
--
"""
        + DIRECTORY_TRIGGERS
        + """
-- The vnode's names so far (the triggers hold back writes until this commits).
"""
        + FILL_DIRECTORY
        + """;
-- Replaced by the directory: the vnode's own '/' prefix index (migration 4).
DROP TABLE {schema}.manta_bucket_prefix;
""",
    ),
    Migration(
        6,
        "a bucket being deleted",
        """
-- The buckets a DeleteBucket is deleting: marked before it checks that the bucket is empty,
-- and a write that finds its bucket marked after its own commit is not acknowledged
-- (buckets.py, Buckets.delete). A table of its own, beside RFD 149's manta_bucket.
-- One row a delete under way (two may run at once: a client retrying one), by its token.
CREATE TABLE {schema}.manta_bucket_deleting (
    owner uuid NOT NULL,
    name text COLLATE "C" NOT NULL,
    id uuid NOT NULL,
    token uuid NOT NULL,
    since timestamptz DEFAULT current_timestamp NOT NULL,

    PRIMARY KEY (owner, name, token)
);
""",
    ),
    Migration(
        7,
        "DeleteBucket marks by token, the directory's triggers as they are now",
        """
-- For vnodes that an earlier version migrated. Migration 6 once made the marks one per
-- bucket, without a token: DeleteBucket would fail on every bucket there.
ALTER TABLE {schema}.manta_bucket_deleting ADD COLUMN IF NOT EXISTS token uuid;
UPDATE {schema}.manta_bucket_deleting SET token = gen_random_uuid() WHERE token IS NULL;
ALTER TABLE {schema}.manta_bucket_deleting ALTER COLUMN token SET NOT NULL;
ALTER TABLE {schema}.manta_bucket_deleting DROP CONSTRAINT manta_bucket_deleting_pkey;
ALTER TABLE {schema}.manta_bucket_deleting ADD PRIMARY KEY (owner, name, token);

-- Migration 5 once made other triggers (a row trigger where a statement trigger is now, no
-- READ COMMITTED guard): they are made again as they are now, and a function no version
-- calls any more goes.
DROP FUNCTION IF EXISTS {schema}.directory_forget(uuid[], uuid[], text[]);
"""
        + DIRECTORY_TRIGGERS,
    ),
)

# The two RFD 149 tables partitioned by deleted_at, in windows (see partitions.py).
DELETED_TABLES = ("manta_bucket_deleted_bucket", "manta_bucket_deleted_object")

CREATE_MIGRATIONS_TABLE = """
CREATE SCHEMA IF NOT EXISTS shoal;
CREATE TABLE IF NOT EXISTS shoal.schema_migrations (
    scope text NOT NULL,
    version int NOT NULL,
    name text NOT NULL,
    applied_at timestamptz DEFAULT current_timestamp NOT NULL,
    PRIMARY KEY (scope, version)
);
"""
