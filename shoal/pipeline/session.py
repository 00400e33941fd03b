"""The Spark session of a pipeline job: local[*] by default, any master by configuration."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from shoal.config import DEFAULT_SPARK_MASTER, PipelineConfig
from shoal.pipeline.settings import chosen_master, session_settings

DEFAULT_MASTER = DEFAULT_SPARK_MASTER


# Spark's own log goes to a file, so that a person at the terminal sees the job's progress and
# one line per failure, not pages of JVM stack traces.
LOG4J2 = """
status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{yyyy-MM-dd HH:mm:ss}} %p %c{{1}}: %m%n
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
"""


def spark_session(
    app: str,
    master: str | None = None,
    log_file: Path | None = None,
    pipeline: PipelineConfig | None = None,
) -> SparkSession:
    """A session whose Python workers use this interpreter (the venv that has Shoal).

    The master, the driver's addresses and ports and the partitions come from `master`, the
    environment and `pipeline` (the `[pipeline]` settings; shoal/pipeline/settings.py).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    pipeline = pipeline or PipelineConfig()
    master = chosen_master(pipeline, master)
    builder = (
        SparkSession.builder.appName(f"shoal-{app}")
        .master(master)
        .config("spark.ui.enabled", "false")
        # Spark's progress bar where a person watches; phase lines from the job otherwise.
        .config("spark.ui.showConsoleProgress", str(sys.stderr.isatty()).lower())
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.worker.reuse", "true")
        # A failed task is a failed job: GC must stop, not retry half-done work blindly.
        .config("spark.task.maxFailures", "1")
        # Outputs name every object and account: folders 0700 and files 0600, whatever the
        # umask of the process that writes them (executors' included).
        .config("spark.hadoop.fs.permissions.umask-mode", "077")
    )
    for key, value in session_settings(pipeline, master).items():
        builder = builder.config(key, value)
    if log_file is not None:
        log_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        settings = log_file.with_suffix(".log4j2.properties")
        settings.write_text(LOG4J2.format(log_file=log_file))
        builder = builder.config(
            "spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{settings}"
        )
    return builder.getOrCreate()
