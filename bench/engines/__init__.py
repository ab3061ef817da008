"""Training engines other than the native loop (bench/train.py): TRL (package ``trl/``) and verl (package ``verl/``)."""
