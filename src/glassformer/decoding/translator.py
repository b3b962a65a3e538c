"""The Translator: Chinese text in, English text out — segmentation, length checks, batching, decoding
(decoding/search.py), detokenization. The CLI, the evaluation and the training loop share it."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence

import torch

from .. import limits
from ..data.batching import padded
from ..data.tokenize import UNK, SourceEncoding, SourceTokenizer, TargetTokenizer
from ..errors import UsageError
from ..inference import compiler, prepare
from ..inference.compiler import CompiledDecoder, cache_folder, unsupported
from ..inference.precision import precision_of, with_precision
from ..model import Transformer
from ..threads import usable_cores
from .choices import AUTO_MIN_SENTENCES, BATCH_SIZE
from .joining import joins
from .search import DEFAULT_ALPHA, DEFAULT_STOP, generate, step, steps, strategy

COMPILE_MODES = ("auto", "on", "off")
SHARED_ANALYSIS = 512       # lines from which a job's later half is segmented by a helper too (`_source_ids`)
CHUNK = 64                  # lines segmented here between two looks for the helper's answer (~1 ms)


def _within_line_limit(text: str, line: int, truncate: bool) -> str:
    """`text` (input line `line`) within MAX_LINE_CHARS characters: cut with truncate, else a LimitError."""
    if len(text) <= limits.MAX_LINE_CHARS or not limits.enforced():
        return text
    if truncate:
        return text[:limits.MAX_LINE_CHARS]
    try:
        limits.check(f"input line {line}: characters", len(text), "MAX_LINE_CHARS")
    except limits.LimitError as error:
        raise limits.LimitError(f"{error} (shorten it or pass --truncate)") from None
    return text


def compile_mode(requested: str, sentences: int, built: Callable[[], bool] = lambda: False) -> tuple[str, str | None]:
    """How a job decodes: "build" (compiled, the packages it needs built where missing), "load" (the packages built
    before, the other shapes eagerly) or "" (eagerly), and a one-line note when `on` was asked for but cannot be.
    auto, with a C++ compiler: "build" for more than AUTO_MIN_SENTENCES sentences, else "load" when a step of its
    search was `built()` before (asked last: it hashes the weights), else eager: a short job never waits for a build."""
    if requested not in COMPILE_MODES:
        raise ValueError(f"compile mode must be one of {COMPILE_MODES}, got {requested!r}")
    if requested == "off":
        return "", None
    if compiler.cxx_compiler() is None:
        note = "--compile on: no C++ compiler found (g++, clang++ or $CXX); decoding eagerly"
        return "", note if requested == "on" else None
    return "build" if requested == "on" or sentences > AUTO_MIN_SENTENCES else "load" if built() else "", None


class Translator:
    """Chinese text in, English text out: segmentation, length checks, batched decoding, detokenization.

    compile: "off" (the model's own decode_step, eagerly, on `prepare(model)`), "on" or "auto" (the same
    step compiled ahead of time for a float32 Transformer on the CPU, inference/compiler.py, greedy k steps a
    call; auto, when a C++ compiler is found: built for jobs of more than AUTO_MIN_SENTENCES sentences, else the
    packages built before, the shapes without one decoded eagerly); packages are kept under
    `compile_cache` (default: inference.compiler.cache_folder). `notes` hears one-line remarks (the CLI:
    stderr). `precision`: "float32" (the model), or "bfloat16" / "int8", decoding on a copy of the model made
    once (`decoding_model`, inference/precision.py; both also compile). The thread count is the caller's (set
    at the entry point: threads.py). `workers` > 1: a job of several batches is decoded in that many processes,
    this one and helpers of one thread each (decoding/workers.py; CPU only; this one at the caller's thread count:
    set one); the helpers copy the model when they start (and make their own copy at `precision`): after changing
    its weights in place, `close()` them."""

    def __init__(self, model, source: SourceTokenizer, target: TargetTokenizer,
                 device: str | torch.device = "cpu", batch_size: int = BATCH_SIZE, compile: str = "off",
                 notes: Callable[[str], None] | None = None, compile_cache: str | None = None) -> None:
        self.model, self.source, self.target = model, source, target
        self.device = torch.device(device)
        self.batch_size = batch_size
        self.compile, self.notes, self.compile_cache = compile, notes, compile_cache
        self.stop = DEFAULT_STOP                                             # decoding/search.py STOP_RULES
        self.precision = "float32"                                           # inference/precision.py DTYPES
        self._copy: tuple | None = None                                      # (model, precision, its copy)
        self._compiled: CompiledDecoder | None = None                        # the model's packages, once loaded
        self.threads: int | None = None                  # the packages' thread count (default: the usable cores)
        self.workers, self._workers = 1, None            # decoding processes; started at the first long job
        self.final = False                 # the next job is the helpers' last (a command's): each ends after it
        self.expected: tuple[int, int, int] | None = None    # a helper's: the job it waits for (`warm`)

    @classmethod
    def load(cls, folder, device: str | torch.device = "cpu") -> Translator:
        from ..data.checkpoint import load_translator_parts

        model, source, target, _ = load_translator_parts(folder, device)
        return cls(model, source, target, device)

    @property
    def max_source_len(self) -> int:
        """Longest source (in units) the model's positions accept."""
        return self.model.cfg.max_len

    def analyse(self, texts: Sequence[str], truncate: bool = False) -> list[SourceEncoding]:
        """Segment and encode each text (units, ids, unknown units). A text over MAX_LINE_CHARS characters is
        refused before it is segmented (a UsageError naming its line and the limit), or with truncate cut to that
        many characters (segmenting a 50M-character line took 10 GB and 100 s)."""
        return [self.source.analyse(_within_line_limit(t, n, truncate)) for n, t in enumerate(texts, start=1)]

    def check_lengths(self, encodings: Sequence[SourceEncoding], truncate: bool = False,
                      first_line: int = 1) -> list[list[int]]:
        """Source ids per text; over-long input is a UsageError naming the limit, or cut with truncate."""
        return self._within_lengths([enc.ids for enc in encodings], truncate, first_line)

    def _within_lengths(self, sources: Sequence[list[int]], truncate: bool, first_line: int = 1) -> list[list[int]]:
        limit = self.max_source_len
        ids = []
        for n, source in enumerate(sources, start=first_line):
            if len(source) > limit and not truncate:
                raise UsageError(f"input line {n}: {len(source)} units, over the model's limit of {limit} "
                                 "source units (shorten it or pass --truncate)")
            ids.append(source[:limit])
        return ids

    def _source_ids(self, texts: Sequence[str], truncate: bool) -> list[list[int]]:
        """`check_lengths(analyse(texts))`. With helpers and SHARED_ANALYSIS lines or more, the later half is also
        segmented by a helper that has started (decoding/workers.py `analyse`), while this process segments the first
        half, then the later one CHUNK lines at a time until the helper's ids are there: nothing waits for it."""
        if self._workers is None or self._workers.key != self._held() or len(texts) < SHARED_ANALYSIS:
            return self.check_lengths(self.analyse(texts, truncate), truncate)     # (helpers of another model: not)
        cut = [_within_line_limit(t, n, truncate) for n, t in enumerate(texts, start=1)]
        half = len(cut) // 2
        number = self._workers.analyse(cut[half:])
        ids = [self.source.analyse(t).ids for t in cut[:half]]
        for start in range(half, len(cut), CHUNK):
            if number is not None and (theirs := self._workers.analysed(number)) is not None:
                ids += theirs[start - half:]
                break
            ids += [self.source.analyse(t).ids for t in cut[start: start + CHUNK]]
        return self._within_lengths(ids, truncate)

    def check_max_length(self, max_length: int | None) -> None:
        """A requested output limit must be a positive count within the model's target positions."""
        if max_length is None:
            return
        limit = self.model.cfg.max_len
        if not 1 <= max_length <= limit:
            raise UsageError(f"--max-length: {max_length} tokens, outside 1..{limit} (the model's limit of "
                             f"{limit} target positions)", "max_length")

    def translate_ids(self, sources: Sequence[Sequence[int]], beam: int = 1, alpha: float = DEFAULT_ALPHA,
                      max_length: int | None = None) -> list[list[int]]:
        """Target ids for source id lists; sorted by length into batches, returned in input order.

        Each sentence generates at most `max_length` tokens (EOS included) when given, else the
        source-length rule of decoding/search.py."""
        self.check_max_length(max_length)
        out: list[list[int]] = [[] for _ in sources]
        order = sorted((i for i, s in enumerate(sources) if len(s)), key=lambda i: len(sources[i]))
        chunks = [order[start: start + self.batch_size] for start in range(0, len(order), self.batch_size)]
        batches = [[list(sources[i]) for i in chunk] for chunk in chunks]
        found = None
        if self.workers > 1 and len(batches) > 1 and self.device.type == "cpu":
            found = self._in_workers(batches, beam, alpha, max_length, len(order))
        if found is None:
            found = self.decode_batches(batches, beam, alpha, max_length, len(order))
        for chunk, hyps in zip(chunks, found, strict=True):
            for i, tokens in zip(chunk, hyps, strict=True):
                out[i] = tokens
        return out

    def decode_batches(self, batches, beam: int, alpha: float, max_length: int | None,
                       sentences: int) -> list[list[list[int]]]:
        """The best hypothesis's target ids per sentence of each batch, decoded here (`sentences`: the job's
        count, for --compile auto)."""
        if not batches:
            return []
        search, pad_id = strategy(beam, scores=False), self.model.cfg.pad_id  # only the ids are kept
        model, compiled = self._decoder(sentences, search)
        sources = (padded(batch, pad_id).to(self.device) for batch in batches)   # (batch, longest) each
        if joins(search, compiled):                 # one run: a batch's sentences join where others ended
            first = next(sources, None)
            if first is None:
                return []
            sizes = [first.size(0)]
            more = (sizes.append(src.size(0)) or src for src in sources)         # taken as rows free up
            hyps = [h[0].tokens for h in generate(model, first, search, alpha=alpha, max_len=max_length,
                                                  stop=self.stop, compiled=compiled, more=more)]
            ends = list(itertools.accumulate(sizes))
            return [hyps[end - size: end] for size, end in zip(sizes, ends, strict=True)]
        found = []
        for src in sources:
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
                hyps = generate(model, src, search, alpha=alpha, max_len=max_length, stop=self.stop,
                                compiled=compiled)
            found.append([h[0].tokens for h in hyps])
        return found

    def warm(self, beam: int, batch_size: int, sentences: int) -> None:
        """Get ready for a job of `sentences` at `beam` in batches of `batch_size` (a helper does while it waits for
        its job): the packages a batch and a sentence decode with loaded, by decoding a made-up batch and sentence
        (unknown units) one step each, each only where its step and source side were both built (`built`); nothing
        is built (a missing package is left to the batch that needs it)."""
        if self.compile == "off" or self.device.type != "cpu":
            return
        search = strategy(beam, scores=False)
        _, compiled = self._decoder(sentences, search)
        if compiled is not None:             # `--compile on` would build a missing package here: for a shape the job
            unknown = [UNK, UNK]             # may never have, in a build a short job then waits for
            batches = [b for b in ([unknown] * batch_size, [unknown]) if compiled.built(search, len(b))]
            if batches:
                self.decode_batches(batches, beam, DEFAULT_ALPHA, 1, sentences)

    def decoding_model(self):
        """The model at `precision`: the model itself for float32, else its copy (made at the first call after
        the model or the precision changed; a UsageError when the precision cannot run here)."""
        if self._copy is None or self._copy[0] is not self.model or self._copy[1] != self.precision:
            self._copy = (self.model, self.precision, with_precision(self.model, self.precision))
        return self._copy[2]

    def _in_workers(self, batches, beam: int, alpha: float, max_length: int | None, sentences: int):
        """The batches decoded here and by the helper processes (started for this model at the first call, unless
        the command started them: `use_workers`), or None after a one-line note when they cannot be started or
        fail (the job is then decoded here alone)."""
        from .workers import Workers
        if not isinstance(self.model, Transformer) or precision_of(self.model) != "float32":   # copies: unpicklable
            self._note(f"--workers {self.workers}: a float32 model (with `precision` to decode at another), not a "
                       f"{precision_of(self.model)} copy; decoding here")
            return None
        try:
            w = self._workers
            if w is None or w.ended or w.key != self._held() or len(w.pipes) != self.workers - 1:
                self.close()
                copy = Translator(self.model, None, None, compile=self.compile, compile_cache=self.compile_cache)
                copy.precision = self.precision                              # each helper makes its own copy
                self.use_workers(Workers(copy, self.workers))
            if not self._workers.announced:                                  # once, at its first job
                n = len(self._workers.pipes)
                self._note(f"decoding in {n + 1} processes (this one and {n} more)")
                self._workers.announced = True
            here = functools.partial(self.decode_batches, beam=beam, alpha=alpha, max_length=max_length,
                                     sentences=sentences)
            return self._workers.decode(batches, here, beam, alpha, max_length, self.stop, sentences,
                                        joining=beam == 1 and self.compile != "off", last=self.final)
        except Exception as error:                                           # pickling, a helper that ended
            self._note(f"--workers {self.workers}: {type(error).__name__}: {str(error)[:160]}; decoding here")
            self.close()
            return None

    def use_workers(self, workers) -> None:
        """Decode long jobs with `workers` (decoding/workers.py), made for this Translator's model as it is now."""
        workers.key = self._held()
        self._workers = workers

    def _held(self) -> tuple:
        return (self.model, self.compile, self.compile_cache, self.precision)

    def close(self) -> None:
        """Stop the worker processes, if any (they also end with this process), and let go of the loaded
        packages (loaded again when next needed)."""
        if self._workers is not None:
            self._workers.close()
            self._workers = None
        self._compiled = None

    def _decoder(self, sentences: int, search) -> tuple:
        """What decodes `sentences` sentences with `search`: the model and its packages (made once per model
        object: a model still training decodes with compile off) when compiling, else `prepare(model)` for a
        float32 Transformer (its weights copied now: a model still training is read afresh at each call) or
        the model as it is (a bfloat16 / int8 copy)."""
        model = self.decoding_model()
        if self.compile != "off" and self.device.type == "cpu" and unsupported(model) is None:
            mode, note = compile_mode(self.compile, sentences, lambda: self._packages(build=False).built(search))
            if note:
                self._note(note)
            if mode:
                return model, self._packages(build=mode == "build")
        fast = isinstance(model, Transformer) and precision_of(model) == "float32"
        return (prepare(model) if fast else model), None

    def _packages(self, build: bool = True) -> CompiledDecoder:
        """The model's packages: built where missing, or (`build` False: --compile auto on a short job) only those
        built before, the other shapes decoded eagerly; greedy in blocks of k steps a call (search.py `steps`)."""
        model = self.decoding_model()
        if self._compiled is None or self._compiled.model is not model or self._compiled.build != build:
            self._compiled = CompiledDecoder(model, step, cache_folder(self.compile_cache), self._note,
                                             self.threads or usable_cores(), steps=steps)
            self._compiled.build = build
        return self._compiled

    def _note(self, line: str) -> None:
        if self.notes is not None:
            self.notes(line)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.target.decode(ids)

    def translate(self, texts: Sequence[str], beam: int = 1, alpha: float = DEFAULT_ALPHA,
                  truncate: bool = False, max_length: int | None = None) -> list[str]:
        """One English line per input text (an empty or blank text gives an empty line)."""
        ids = self._source_ids(texts, truncate)
        return self._detokenized(ids, self.translate_ids(ids, beam, alpha, max_length))

    def translate_units(self, unit_lists: Sequence[Sequence[str]], beam: int = 1, alpha: float = DEFAULT_ALPHA,
                        max_length: int | None = None) -> list[str]:
        """Translate already segmented sources (e.g. the corpus's gold units)."""
        limit = self.max_source_len
        ids = [self.source.vocab.encode(list(units))[:limit] for units in unit_lists]
        return self._detokenized(ids, self.translate_ids(ids, beam, alpha, max_length))

    def _detokenized(self, sources: list[list[int]], hyps: list[list[int]]) -> list[str]:
        return [self.detokenize(h) if src else "" for h, src in zip(hyps, sources, strict=True)]
