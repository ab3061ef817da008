"""Peak bytes of the CPU tensor storage allocated while a block runs, counted at the dispatcher.

Every op's outputs pass through ``__torch_dispatch__`` (forward, backward and checkpoint recomputation alike); a new
storage is counted when it first appears and uncounted once it is freed (its weak reference expires). Unlike the
process RSS this does not depend on the allocator (glibc's heap growth and fragmentation made an RSS measurement of
the same pass vary from 167 to 1011 MiB between runs and machines), so a bound derived from tensor sizes can be
checked exactly. Tensors that existed before the block (the parameters) are not counted.
"""

from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveTensorBytes(TorchDispatchMode):
    """``with LiveTensorBytes() as m: ...`` then ``m.peak`` (bytes): the most CPU tensor storage alive at once."""

    def __init__(self):
        super().__init__()
        self.refs: dict[int, tuple[StorageWeakRef, int]] = {}
        self.live = 0
        self.peak = 0

    def _sweep(self) -> None:
        for key in [k for k, (ref, _) in self.refs.items() if ref.expired()]:
            self.live -= self.refs.pop(key)[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._sweep()
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                ref = StorageWeakRef(storage)
                if storage.nbytes() == 0 or ref.cdata in self.refs:
                    continue  # a view of a counted storage
                self.refs[ref.cdata] = (ref, storage.nbytes())
                self.live += storage.nbytes()
        self.peak = max(self.peak, self.live)
        return out
