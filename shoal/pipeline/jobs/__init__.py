"""The pipeline's jobs: each module has `run(context) -> Summary`."""
