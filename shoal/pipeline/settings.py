"""Which Spark master a job runs on, and how the driver meets its executors there.

A local master (or a standalone master on a loopback address, whose workers can only be on
this machine) keeps the driver on 127.0.0.1: nothing listens beyond the machine. Any other
master has executors on other machines, which connect back to the driver: it then listens on
every interface and advertises this host's name (or the configured address), on fixed ports
when the configuration names them, for firewalls.

The order, for each of master, driver host and partitions: the command line (`--master`),
then the environment (SHOAL_SPARK_*), then `[pipeline]` in the configuration file, then the
default.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

from shoal.config import PipelineConfig

MASTER_ENV = "SHOAL_SPARK_MASTER"
DRIVER_HOST_ENV = "SHOAL_SPARK_DRIVER_HOST"
PARTITIONS_ENV = "SHOAL_SPARK_PARTITIONS"
LOOPBACK = "127.0.0.1"
EVERY_INTERFACE = "0.0.0.0"


def chosen_master(pipeline: PipelineConfig, master: str | None = None) -> str:
    """`--master`, else SHOAL_SPARK_MASTER, else `[pipeline] master` (local[*] by default)."""
    return master or os.environ.get(MASTER_ENV) or pipeline.master


def is_local(master: str) -> bool:
    """Whether every executor of this master runs on this machine: `local...`, or a
    standalone master (or every one of an HA list) on a loopback address."""
    if master.startswith("local"):
        return True
    if not master.startswith("spark://"):
        return False
    hosts = [_host_of(address) for address in master.removeprefix("spark://").split(",")]
    return all(_is_loopback(host) for host in hosts)


def session_settings(pipeline: PipelineConfig, master: str) -> dict[str, str]:
    """The Spark settings of the driver's networking, executors and partitions for `master`."""
    local = is_local(master)
    settings: dict[str, str] = {
        "spark.driver.bindAddress": pipeline.driver_bind_address
        or (LOOPBACK if local else EVERY_INTERFACE),
        "spark.sql.shuffle.partitions": os.environ.get(PARTITIONS_ENV) or str(pipeline.partitions),
    }
    host = os.environ.get(DRIVER_HOST_ENV) or pipeline.driver_host
    if not host:
        host = LOOPBACK if local else (resolvable_host_name() or "")
    if host:  # else Spark advertises an address of its own choice (a non-loopback one)
        settings["spark.driver.host"] = host
    if pipeline.driver_port:
        settings["spark.driver.port"] = str(pipeline.driver_port)
    if pipeline.block_manager_port:
        settings["spark.blockManager.port"] = str(pipeline.block_manager_port)
    if pipeline.executor_memory:
        settings["spark.executor.memory"] = pipeline.executor_memory
    if pipeline.executor_cores:
        settings["spark.executor.cores"] = str(pipeline.executor_cores)
    if not master.startswith("local"):
        # Executors, started by workers with environments of their own, import Shoal from
        # where the driver did (the same path on every machine), ahead of whatever their
        # worker's environment has: a worker started from another checkout or venv still
        # runs this driver's code.
        settings["spark.executorEnv.PYTHONPATH"] = shoal_source_folder()
    settings.update(dict(pipeline.spark))
    return settings


def resolvable_host_name() -> str | None:
    """This host's fully qualified name, if it resolves to an address other machines can
    reach (a name that resolves to 127.0.0.1 only would send executors to themselves)."""
    name = socket.getfqdn()
    try:
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(name, None)}
    except OSError:
        return None
    if addresses and not all(_is_loopback(address) for address in addresses):
        return name
    return None


def shoal_source_folder() -> str:
    """The folder holding the `shoal` package this process runs."""
    import shoal

    return str(Path(shoal.__file__).resolve().parent.parent)


def _host_of(address: str) -> str:
    """'host:port' or '[v6]:port' -> the host."""
    if address.startswith("["):
        return address[1:].partition("]")[0]
    return address.rpartition(":")[0] if ":" in address else address


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False
