"""Fixed addresses for TensorRT-RTX's own CUDA graphs (cuda_graph_strategy="whole_graph_capture").

TensorRT-RTX replays the graph it captured for a context's shapes only while every tensor bound
to the context stays where it was: a new address for any input or output makes it capture the
engine again (every kernel enqueued once more, the executable graph updated and the captured one
destroyed). For a 12-layer decoder's decode step that is about half a millisecond of CPU time,
more than the step's kernels take on a large GPU. Hugging Face's `generate` hands every decode
step new input tensors (the token, its positions), and the caller still holds one step's logits
while the next step allocates its own, so without staging every step would be captured anew.

`Staging` keeps those addresses fixed. An input whose address moved since the last call, when
small (SMALL bytes at most), is copied into a buffer of the binding's own that stays bound; an
output whose fresh memory lands elsewhere than the last call's is written into a buffer of the
binding's own and handed back as a copy. Tensors that keep their addresses (a KV cache written in
place, an input the caller passes again, a result freed before the next call) are bound as they
are, with no copy. Once a large input moves, the engine is captured again on such calls anyway,
so the binding stops staging: its copies would buy nothing.
"""

from __future__ import annotations

import torch

SMALL = 4 << 20  # bytes: a copy of this much costs a few microseconds of GPU time


class Staging:
    """The buffers of one execution context's staged inputs and outputs, by tensor name."""

    __slots__ = ("inputs", "off", "outputs")

    def __init__(self) -> None:
        self.inputs: dict[str, torch.Tensor] = {}
        self.outputs: dict[str, torch.Tensor] = {}
        self.off = False

    def input(self, name: str, tensor: torch.Tensor, bound: int | None) -> torch.Tensor:
        """What to bind for input `name` (contiguous, on the engine's device), whose address is not
        the one bound now (`bound`; None before the first call): the tensor, or a buffer holding a
        copy of it."""
        if self.off:
            return tensor
        if tensor.nbytes > SMALL:
            if bound is not None:
                self.stop()
            return tensor
        buffer = self.inputs.get(name)
        if buffer is None and bound is None:
            return tensor  # the first call: nothing has moved yet
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = self.inputs[name] = torch.empty_like(tensor)
        buffer.copy_(tensor)
        return buffer

    def output(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        """The buffer output `name` is written into at this shape, or None (a fresh tensor)."""
        buffer = self.outputs.get(name)
        if buffer is None or self.off or tuple(buffer.shape) != shape or buffer.dtype != dtype:
            return None
        return buffer

    def keep(self, name: str, fresh: torch.Tensor, bound: int | None) -> bool:
        """Whether the fresh output tensor becomes output `name`'s buffer (it landed elsewhere than
        the memory bound before): then the call hands back a copy of it."""
        moved = bound is not None and bound != fresh.data_ptr()
        if self.off or not moved or fresh.nbytes > SMALL:
            if moved and not self.off:
                self.stop()  # a large output that moves: captured again on such calls anyway
            self.outputs.pop(name, None)
            return False
        self.outputs[name] = fresh
        return True

    def stop(self) -> None:
        self.off = True
        self.inputs.clear()
        self.outputs.clear()
