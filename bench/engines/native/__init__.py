"""The native training engine: pobench's own loop (``loop``), one step of it (``step``), micro-batching, checkpoints and
the memory options (LoRA, activation checkpointing, the reference policy)."""
