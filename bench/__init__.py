"""pobench: the command line, rollout sampler, training engines and comparisons of the policy-optimization benchmark
suite."""

__version__ = "0.1.0"
