"""Storage nodes and the data path: objects as chunked, replicated, checksummed blocks."""

from shoal.storage.blockfile import BlockInfo, BlockStore, block_name, parse_block_name
from shoal.storage.client import (
    BlockClient,
    BlockCorrupted,
    BlockMissing,
    ClientSettings,
    NodeError,
    NodeRefused,
    NodeStatus,
    NodeUnavailable,
    NodeUnreachable,
)
from shoal.storage.datapath import (
    DEFAULT_BLOCK_SIZE,
    BlockRun,
    DataPath,
    DataUnavailable,
    DeleteOutcome,
    NodeDirectory,
    ReplicasUnreachable,
    StorageUnavailable,
    WriteResult,
    block_runs,
    names_by_node,
)
from shoal.storage.placement import Node
from shoal.storage.server import NodeIdentity, NodeServer

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "BlockClient",
    "BlockCorrupted",
    "BlockInfo",
    "BlockMissing",
    "BlockRun",
    "BlockStore",
    "ClientSettings",
    "DataPath",
    "DataUnavailable",
    "DeleteOutcome",
    "Node",
    "NodeDirectory",
    "NodeError",
    "NodeIdentity",
    "NodeRefused",
    "NodeServer",
    "NodeStatus",
    "NodeUnavailable",
    "NodeUnreachable",
    "ReplicasUnreachable",
    "StorageUnavailable",
    "WriteResult",
    "block_name",
    "block_runs",
    "names_by_node",
    "parse_block_name",
]
