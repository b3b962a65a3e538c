"""inference: speed applied on purpose to the model's own decoding, the same numbers faster on the CPU.

    fast = prepare(model)                          # a copy: W^T / pre-blocked weights, fused W^Q|W^K|W^V, no hooks
    generate(fast, src, Greedy())                  # decoding/search.py: the model's decode_step, eagerly
    generate(model, src, Greedy(), compiled=CompiledDecoder(model, step, folder))   # compiled ahead of time

`model/` stays the reference: tests hold the prepared copy's and the compiled step's tokens identical
(tests/test_inference.py, tests/test_compiled.py). Threads (threads.py) and inductor's cache folder
(compiler.use_compile_cache) are set by the entry points (CLI, lab, training, benchmarks), never in here.
"""

from ..threads import SERIAL_MAX_ROWS, SERVING_THREADS, decoding_threads, training_threads, use_threads
from .prepare import ONEDNN, PreparedLinear, prepare

__all__ = ["prepare", "SERIAL_MAX_ROWS", "decoding_threads", "SERVING_THREADS", "training_threads",
           "use_threads", "ONEDNN", "PreparedLinear"]
