"""One training run's life, the same for every engine (issue 30): what an engine enters before its first step and
leaves after its last, so that an engine is its training step and nothing else.

``lifecycle``   the door: the run folder (claimed, locked), seed and threads, the MLflow run opened (or reopened on a
                resume) with every engine's tags and params, checkpoints saved / loaded / verified, the final weights,
                SIGTERM as an interrupt, and the run's end (FINISHED, KILLED, FAILED with its cause)
``tracking``    the MLflow store (reachability, the client) and the run's buffered logger, with its system metrics
``resume``      ``--resume``: the run's own configuration, the rerun command
``identity``    the digests of a run's inputs (data, model, tasks), part of its configuration key
``stop``        the stop signals (SIGINT / SIGTERM) and the exit code they give

and inside the package only (tests/test_layers.py checks it): ``folders`` (the run folder's layout and ownership),
``locks`` (a training process's lock on its run folder), ``checkpoint`` (format, atomic writes, verification),
``system_metrics``. A module outside ``bench/runs`` reaches them through ``lifecycle``.

This ``__init__`` imports nothing, so that importing ``bench.runs.stop`` (every command does) stays light.
"""
