"""The Spark session of a pipeline job: local[*] by default, any master by configuration."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"


def spark_session(app: str, master: str | None = None) -> SparkSession:
    """A session whose Python workers use this interpreter (the venv that has Shoal)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(f"shoal-{app}")
        .master(master or os.environ.get("SHOAL_SPARK_MASTER", DEFAULT_MASTER))
        .config("spark.driver.host", os.environ.get("SHOAL_SPARK_DRIVER_HOST", "127.0.0.1"))
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        # Spark's progress bar where a person watches; phase lines from the job otherwise.
        .config("spark.ui.showConsoleProgress", str(sys.stderr.isatty()).lower())
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", os.environ.get("SHOAL_SPARK_PARTITIONS", "8"))
        .config("spark.python.worker.reuse", "true")
        # A failed task is a failed job: GC must stop, not retry half-done work blindly.
        .config("spark.task.maxFailures", "1")
    )
    return builder.getOrCreate()
