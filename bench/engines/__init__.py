"""Training engines other than the native loop (bench/train.py): TRL (trl.py) and verl (verl.py)."""
