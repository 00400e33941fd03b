"""The Spark session of a pipeline job: local[*] by default, any master by configuration."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from shoal.config import PipelineConfig
from shoal.pipeline.settings import chosen_master, session_settings

# Spark 4 runs on Java 17 or newer.
JAVA_NEEDED = 17
JAVA_HINT = "apt install openjdk-17-jre-headless (or set JAVA_HOME)"


class JavaMissing(Exception):
    """No Java, or one too old, for Spark."""


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
    require_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    pipeline = pipeline or PipelineConfig()
    master = chosen_master(pipeline, master)
    builder = (
        SparkSession.builder.appName(f"shoal-{app}")
        .master(master)
        .config("spark.ui.enabled", "false")
        # The job draws its own bar, naming its phase (progress.py), in place of Spark's.
        .config("spark.ui.showConsoleProgress", "false")
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


def require_java() -> None:
    """Raise JavaMissing, one line long, unless the Java that Spark would start (JAVA_HOME's,
    else the first on PATH) is JAVA_NEEDED or newer; Spark's own failure is pages of text."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    where = f"JAVA_HOME={home}" if home else "PATH"
    if java is None or not Path(java).is_file():
        raise JavaMissing(f"needs Java {JAVA_NEEDED} or newer, none found on {where}: {JAVA_HINT}")
    try:
        answer = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=60, check=False
        )
    except OSError as exc:
        raise JavaMissing(
            f"needs Java {JAVA_NEEDED} or newer; {java}: {exc}: {JAVA_HINT}"
        ) from None
    version = java_version(answer.stderr + answer.stdout)
    if version is None or version < JAVA_NEEDED:
        found = f"Java {version}" if version else "no Java version"
        raise JavaMissing(f"needs Java {JAVA_NEEDED} or newer, {java} is {found}: {JAVA_HINT}")


def java_version(text: str) -> int | None:
    """The feature version `java -version` prints: `"17.0.9"` -> 17, `"1.8.0_392"` -> 8."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if match is None:
        return None
    major = int(match[1])
    return int(match[2] or 0) if major == 1 else major
