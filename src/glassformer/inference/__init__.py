"""inference: speed applied on purpose: `prepare(model)`, the same decoding as `glassformer.model`, faster on the CPU.

    fast = prepare(model)                 # a copy: prepared weights, no hooks, SDPA
    greedy(fast, src)                     # translation works with either the model or its prepared copy
    greedy(StaticDecoder(model, compiled=True), src)   # the static step under torch.compile (static.py)

`model/` stays the reference: tests hold the prepared copy's tokens identical and its logits equal to
float rounding (tests/test_inference.py). The thread policy (threads.py) is decided once per entry
point by the CLI, the lab, training and the benchmarks; nothing here changes it inside a forward.
"""

from .prepare import prepare
from .static import StaticDecoder
from .threads import SERIAL_MAX_ROWS, decoding_threads, serving_threads, training_threads, use_threads
from .weights import ONEDNN, PreparedLinear

__all__ = ["prepare", "StaticDecoder", "SERIAL_MAX_ROWS", "decoding_threads", "serving_threads", "training_threads",
           "use_threads", "ONEDNN", "PreparedLinear"]
