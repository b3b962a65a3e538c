"""Speed applied on purpose: the same decoding as `glassformer.model`, faster on the CPU.

    decoder = StepDecoder(model)          # prepared weights, static KV cache, one-query steps
    greedy(decoder, src)                  # translation.decode works with either the model or this

`model/` stays the reference: tests hold this package's tokens identical and its logits equal to
float rounding (tests/test_inference.py). The thread policy (threads.py) is decided once per entry
point by the CLI, the lab, training and the benchmarks; nothing here changes it inside a forward.
"""

from .cache import StaticCache
from .step import StepDecoder
from .threads import SERIAL_MAX_ROWS, decoding_threads, serving_threads, training_threads, use_threads
from .weights import ONEDNN, PreparedLinear

__all__ = ["StaticCache", "StepDecoder", "SERIAL_MAX_ROWS", "decoding_threads", "serving_threads",
           "training_threads", "use_threads", "ONEDNN", "PreparedLinear"]
