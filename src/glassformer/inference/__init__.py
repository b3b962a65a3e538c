"""inference: speed applied on purpose to the model's own decoding, the same numbers faster on the CPU.

    fast = prepare(model)                          # a copy: W^T / pre-blocked weights, fused W^Q|W^K|W^V, no hooks
    generate(fast, src, Greedy())                  # decoding/search.py: the model's decode_step, eagerly
    generate(model, src, Greedy(), compiled=CompiledDecoder(model, step, folder))   # compiled ahead of time

`model/` stays the reference: tests hold the prepared copy's and the compiled step's tokens identical and
their logits equal to float rounding (tests/test_inference.py, tests/test_compiled.py). The thread policy
(threads.py) is decided once per entry point by the CLI, the lab, training and the benchmarks; nothing
here changes it, nor any other process-wide setting.
"""

from .prepare import prepare
from .threads import SERIAL_MAX_ROWS, decoding_threads, serving_threads, training_threads, use_threads
from .weights import ONEDNN, PreparedLinear

__all__ = ["prepare", "SERIAL_MAX_ROWS", "decoding_threads", "serving_threads", "training_threads",
           "use_threads", "ONEDNN", "PreparedLinear"]
