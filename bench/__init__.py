"""pobench: the CLI, rollout engine, training loop and harness of the policy-optimization benchmark suite."""

__version__ = "0.1.0"
