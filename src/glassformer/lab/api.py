"""The lab's JSON API, independent of HTTP: one method per endpoint, plain dicts in and out.

Endpoints (documented in docs/lab.md) are the rows of `LabAPI.ROUTES`: POST /api/trace, GET /api/block,
POST /api/sentence, GET /api/masks, GET /api/verify, POST /api/patch, POST /api/attribute, GET /api/info.
Bodies are checked by glassformer.validation; bad input raises glassformer.errors.UsageError (its `status`
400, or 413 over a limit of glassformer.limits, and its `field`); the server turns it into
{"error": ..., "field": ...}. The model is shared by every request thread, so each use of it holds
`LabAPI.lock` and runs under torch.inference_mode (POST /api/attribute takes gradients: autograd on,
still under the lock).
"""

from __future__ import annotations

import copy
import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import torch
from pydantic import BeforeValidator, Field

from .. import __version__, limits
from ..errors import UsageError
from ..interpret.explain import walk_sentence
from ..interpret.patching import MAX_CORRUPT, lesson_patching
from ..lesson import examples
from ..lesson.views import lesson_batch
from ..model import Recording, Transformer
from ..validation import Schema, Text, type_name
from .attribution_api import attribute_endpoint
from .bodies import DEFAULT_SOURCE, DEFAULT_TARGET, checked_body, finite_json, lesson_text
from .models import UNTRAINED_SEED, LabModel, load_model, untrained_model

__all__ = ["DEFAULT_SOURCE", "DEFAULT_TARGET", "UNTRAINED_SEED", "LabAPI", "LabModel", "load_model",
           "untrained_model"]

# The lesson's sentence, target and corruption (glassformer.lesson.examples), as the page shows them
PATCH_CORRUPT = examples.in_units(examples.HER_UNITS)            # 他 → 她: does `him` still come out?
BLOCK_TOKENS = ("我", "给", "书")             # the positions the lesson's BLOCK rows stand for
PAGE_DTYPE = "float32"               # the page's weights: float16 moved attributions by percents (docs/lab.md); the
                                     # offline file packs them losslessly instead (bundle.pack_weights)
PAGE_LIMITS = ("MAX_SOURCE_CHARS", "MAX_TARGET_CHARS", "MAX_SENTENCE_TOKENS", "MAX_TOP_K", "MAX_BEAM")


# ---- request checking --------------------------------------------------------------------------
class SentenceBody(Schema):
    """POST /api/sentence: the source (Chinese), an optional target (English), two view switches."""

    source: Text
    target: Text | None = None
    positions: bool = True
    top_k: Annotated[int, Field(ge=1, le=limits.MAX_TOP_K)] = 5


def _one_or_many(value: Any) -> Any:
    """A single sentence stands for a list of one."""
    return [value] if isinstance(value, str) else value


class PatchBody(Schema):
    """POST /api/patch: the clean sentence, one or more corrupted ones, the target and the word to predict
    (clean and corrupt default to the lesson's pair, as `lesson_text` writes it for the model)."""

    clean: Text | None = None
    corrupt: Annotated[Annotated[list[Text], Field(min_length=1, max_length=MAX_CORRUPT)] | None,
                       BeforeValidator(_one_or_many)] = None
    target: Text = DEFAULT_TARGET
    predict: Text = examples.LESSON_PREDICT
    positions: bool = True
    method: Literal["activation", "attribution"] = "activation"   # a forward pass per cell | one backward


def _round(value: float, digits: int = 6) -> float | None:
    value = float(value)
    return round(value, digits) if math.isfinite(value) else None


def _rows(t: torch.Tensor, digits: int = 6) -> list:
    """A tensor as nested lists of rounded floats (non-finite values become null)."""
    if t.dim() == 0:
        return _round(t.item(), digits)
    return [_rows(x, digits) for x in t]


def claim_view(claim_id: str) -> str | None:
    """Which view of the lab shows a claim (an anchor of the page), if any."""
    views = {"A": "#block", "B": "#block", "D": "#sentence", "E": "#masks", "G": "#block"}
    special = {"A1": "#sentence", "C1": "#sentence", "C2": "#sentence", "C3": "#block", "G2": "#sentence"}
    return special.get(claim_id, views.get(claim_id[:1]))


# ---- the API -----------------------------------------------------------------------------------
class LabAPI:
    """Every endpoint as a method, listed in ROUTES (the server turns each row into a Starlette route)."""

    def __init__(self, model: LabModel | None = None, *, model_dir: str | Path | None = None,
                 run_spec: Callable[[dict], dict] | None = None,
                 run_claims: Callable[[], list] | None = None) -> None:
        self._model = model
        self._model_dir = model_dir
        self._run_spec = run_spec
        self._run_claims = run_claims
        self.lock = threading.Lock()            # guards the shared model while it runs
        self._load_lock = threading.Lock()      # guards the lazily loaded model
        self._verify_lock = threading.Lock()    # guards the claims table (apart: /api/info must not wait on it)
        self._verify_cache: dict | None = None
        self._bundle_lock = threading.Lock()    # guards the model bundle (built once, at its first request)
        self._bundle_cache: dict | None = None

    # -- dependencies, loaded when first needed
    @property
    def lab_model(self) -> LabModel:
        with self._load_lock:
            if self._model is None:
                self._model = load_model(self._model_dir, required=self._model_dir is not None)
            return self._model

    def _spec_runner(self) -> Callable[[dict], dict]:
        if self._run_spec is None:
            from ..lesson.spec import run_spec
            self._run_spec = run_spec
        return self._run_spec

    # -- the endpoints: (HTTP method, path, method of this class). A POST method takes the JSON body,
    # a GET method nothing; both return a JSON-able dict or raise UsageError. A new endpoint is one row
    # here and one method below.
    ROUTES: tuple[tuple[str, str, str], ...] = (
        ("POST", "/api/trace", "trace"),
        ("GET", "/api/block", "block"),
        ("POST", "/api/sentence", "sentence"),
        ("GET", "/api/masks", "masks"),
        ("GET", "/api/verify", "verify"),
        ("POST", "/api/patch", "patch"),
        ("POST", "/api/attribute", "attribute"),
        ("GET", "/api/info", "info"),
        ("GET", "/api/bundle", "bundle"),
    )

    # -- POST /api/trace
    def trace(self, doc: Any) -> dict:
        """A trace-spec v1 document through `run_spec` (the function behind `glassformer trace`)."""
        run_spec = self._spec_runner()
        if not isinstance(doc, dict):
            raise UsageError(f"trace spec must be a JSON object, got {type_name(doc)}", "body")
        return finite_json(run_spec(doc))

    # -- GET /api/block
    def block(self) -> dict:
        """The lesson's BLOCK as a trace spec, the units its rows stand for, and the 2×3 exercise (unscaled)."""
        return {"spec": examples.block_spec(), "tokens": list(BLOCK_TOKENS),
                "exercise": examples.exercise_spec(scale=False)}

    # -- POST /api/sentence
    def sentence(self, body: Any) -> dict:
        """One sentence through the translator: every attention table and each target row's next tokens."""
        request = checked_body(SentenceBody, body)
        source, target, positions, top_k = request.source, request.target, request.positions, request.top_k
        if not source.strip():
            raise UsageError("source must be a non-empty string of Chinese text", "source")
        limits.check("source: characters", len(source), "MAX_SOURCE_CHARS", "source")
        if target is not None:
            limits.check("target: characters", len(target), "MAX_TARGET_CHARS", "target")
            if not target.strip():
                target = None

        lab = self.lab_model
        encoding = lab.source.analyse(source)
        if not encoding.units:
            raise UsageError("source has no units after splitting", "source")
        limits.check("source: units", len(encoding.units), "MAX_SENTENCE_TOKENS", "source")
        limit = lab.model.cfg.max_len
        if len(encoding.units) > limit:
            raise UsageError(f"source has {len(encoding.units)} units; the model takes at most {limit}",
                             "source")
        target_ids = lab.target.encode(target) if target is not None else None
        if target_ids is not None:
            limits.check("target: tokens", len(target_ids), "MAX_SENTENCE_TOKENS", "target")
        if target_ids is not None and len(target_ids) + 1 > limit:
            raise UsageError(f"target has {len(target_ids)} tokens; the model takes at most {limit - 1}",
                             "target")
        model = lab.model if positions else lab.no_positions
        with self.lock, torch.inference_mode():
            result = _run_sentence(model, lab, encoding.ids, target_ids, top_k)
        return {
            "model": self.describe(lab),
            "source": encoding.units,
            "source_ids": encoding.ids,
            "unknown": encoding.unknown,
            "positions": positions,
            "mode": "teacher_forced" if target is not None else "greedy",
            **result,
        }

    # -- GET /api/masks
    def masks(self) -> dict:
        """The lesson's two-sentence batch and every mask it needs (True = may attend / counts)."""
        return lesson_batch().to_json()

    # -- GET /api/verify
    def verify(self) -> dict:
        """The claims table (computed once per server, then served from memory)."""
        with self._verify_lock:
            if self._verify_cache is None:
                from ..lesson import claims
                table = claims.as_json((self._run_claims or claims.run_all)())
                for row in table["claims"]:
                    row["view"] = claim_view(row["id"])
                self._verify_cache = table
            return copy.deepcopy(self._verify_cache)

    # -- POST /api/patch
    def patch(self, body: Any) -> dict:
        """Patching at the `gave` row: each cross-attention head and encoder position, clean → corrupted; run
        (activation) or estimated from one backward pass (attribution, which needs gradients)."""
        request = checked_body(PatchBody, body)
        lab = self.lab_model
        grad = torch.enable_grad() if request.method == "attribution" else torch.inference_mode()
        with self.lock, grad:
            clean = lesson_text(DEFAULT_SOURCE, lab.source) if request.clean is None else request.clean
            corrupt = [lesson_text(PATCH_CORRUPT, lab.source)] if request.corrupt is None else request.corrupt
            result = lesson_patching(lab.model, lab.source, lab.target, clean, corrupt,
                                     request.target, request.predict, positions=request.positions,
                                     method=request.method)
        return {"model": self.describe(lab), **finite_json(result)}

    # -- POST /api/attribute (the "Why him" view: lab/attribution_api.py)
    def attribute(self, body: Any) -> dict:
        return attribute_endpoint(self, body)

    # -- GET /api/info
    def info(self) -> dict:
        """What the Sentence view runs: trained or untrained, from where, with which sizes."""
        source = self.lab_model.source
        return {"glassformer": __version__, "model": self.describe(self.lab_model),
                "default_source": lesson_text(DEFAULT_SOURCE, source), "default_target": DEFAULT_TARGET,
                "patch_corrupt": lesson_text(PATCH_CORRUPT, source),
                "patch_predict": examples.LESSON_PREDICT, "swap": list(examples.SWAP_PAIR)}

    # -- GET /api/bundle
    def bundle(self) -> dict:
        """The model as the page's engine reads it (lab/bundle.py), the limits the page checks and the model's
        description; {"unsupported": reason} for a model only the server runs (a SentencePiece vocabulary)."""
        with self._bundle_lock:
            if self._bundle_cache is None:
                self._bundle_cache = self.page_payload()
            return self._bundle_cache

    def page_payload(self, dtype: str = PAGE_DTYPE) -> dict:
        """What the page's engine loads: the model bundle, the limits the page checks, the model's description
        (GET /api/bundle, and the offline page's last element).

        A model the engine cannot run (a SentencePiece vocabulary) gives {"unsupported": reason}: the page then
        asks the server, as before."""
        from ..data.tokenize import SourceTokenizer, TargetTokenizer
        from .bundle import write_bundle

        lab = self.lab_model
        if not isinstance(lab.source, SourceTokenizer) or not isinstance(lab.target, TargetTokenizer):
            return {"unsupported": "this model's tokenizers (SentencePiece) run on the server only"}
        with self.lock:
            bundle = write_bundle(lab.model, (lab.source, lab.target), dtype=dtype)
        return {"bundle": bundle, "limits": {name: getattr(limits, name) for name in PAGE_LIMITS},
                "model": self.describe(lab)}

    @staticmethod
    def describe(lab: LabModel) -> dict:
        """Trained or untrained, where from, sizes, and a label in both languages."""
        cfg = lab.model.cfg
        return {
            "trained": lab.trained,
            "origin": lab.origin,
            "label": ({"zh": f"已训练的翻译模型（{lab.origin}）", "en": f"trained translator ({lab.origin})"}
                      if lab.trained else
                      {"zh": "未训练的模型：随机初始化（种子固定），输出没有意义，只用来看结构",
                       "en": "untrained model: seeded random weights; its outputs are meaningless, "
                             "it only shows the structure"}),
            "parameters": sum(p.numel() for p in lab.model.parameters()),
            "config": {k: cfg.to_dict()[k] for k in ("d_model", "heads", "d_k", "d_v", "d_ff", "encoder_layers",
                                                     "decoder_layers", "norm_placement", "positions", "max_len")},
            "src_vocab": cfg.src_vocab,
            "tgt_vocab": cfg.tgt_vocab,
        }


ATTENTION_PROBES = ("encoder.*.self_attention.head.*.weights", "decoder.*.self_attention.head.*.weights",
                    "decoder.*.cross_attention.head.*.weights")


def _stack(trace: Recording, stack: str, part: str, layers: int, heads: int) -> list:
    """[layer][head] -> (query, key) weight table of sample 0, rounded."""
    return [[_rows(trace[f"{stack}.{i}.{part}.head.{h}.weights"][0]) for h in range(heads)]
            for i in range(layers)]


def _run_sentence(model: Transformer, lab: LabModel, source_ids: list[int], target_ids: list[int] | None,
                  top_k: int) -> dict:
    """Teacher-forced pass over BOS + target (greedy output when no target), traced for attention: the walk
    `glassformer explain` takes (translation.explain.walk_sentence)."""
    cfg = model.cfg
    walk = walk_sentence(model, source_ids, target_ids, ATTENTION_PROBES, top=top_k)
    rows = [{"input": lab.piece(r.input_id), "next": lab.piece(r.next_id), "next_id": r.next_id,
             "next_prob": float(f"{r.p_next:.6g}"), "next_rank": r.rank,
             "top": [{"token": lab.piece(t), "id": t, "prob": float(f"{p:.6g}")} for t, p in r.top]}
            for r in walk.rows]
    return {
        "target": [lab.piece(t) for t in walk.inputs],
        "target_ids": walk.inputs,
        "translation": lab.target.decode(walk.output),
        "finished": walk.finished,
        "layers": {"encoder": cfg.encoder_layers, "decoder": cfg.decoder_layers},
        "heads": cfg.heads,
        "encoder_self_attention": _stack(walk.trace, "encoder", "self_attention", cfg.encoder_layers, cfg.heads),
        "decoder_self_attention": _stack(walk.trace, "decoder", "self_attention", cfg.decoder_layers, cfg.heads),
        "cross_attention": _stack(walk.trace, "decoder", "cross_attention", cfg.decoder_layers, cfg.heads),
        "next_tokens": rows,
        "pad_id": cfg.pad_id,
    }
