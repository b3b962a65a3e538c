"""The lab's JSON API, independent of HTTP: one method per endpoint, plain dicts in and out.

Endpoints (documented in docs/lab.md): POST /api/trace, GET /api/block, POST /api/sentence,
GET /api/masks, GET /api/verify, POST /api/patch, GET /api/info. Bad input raises `ApiError` (status 400 and the
offending field); the server turns it into {"error": ..., "field": ...}. The model is shared by
every request thread, so each use of it holds `LabAPI.lock` and runs under torch.inference_mode.
"""

from __future__ import annotations

import copy
import math
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from .. import __version__
from ..errors import UsageError
from ..lesson import examples
from ..lesson.views import lesson_batch, next_token_walk, walk_inputs
from ..model import ModelConfig, Recording, Transformer
from ..translation.decode import greedy, output_limits
from ..translation.tokenize import BOS, EOS, PAD, SPECIAL_TOKENS, SourceTokenizer, TargetTokenizer, Vocab

DEFAULT_MODEL_DIR = "runs/default"
DEFAULT_SOURCE = "我／昨天／给／了／他／一／本／书／。"
DEFAULT_TARGET = "I gave him a book yesterday."
SWAP_PAIR = ("我", "他")                      # claim C2: 我给他 is not 他给我
PATCH_CORRUPT = "我／昨天／给／了／她／一／本／书／。"   # 他 → 她: does `him` still come out?
BLOCK_TOKENS = ("我", "给", "书")             # the positions the lesson's BLOCK rows stand for
MAX_SOURCE_CHARS = 400
MAX_TARGET_CHARS = 800
MAX_TOP_K = 20
UNTRAINED_SEED = 0


class ApiError(Exception):
    """A request the API refuses: HTTP status, a one-line message, and the field it is about."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.field = status, message, field

    def payload(self) -> dict:
        return {"error": self.message, "field": self.field}


# ---- the model the Sentence view runs ----------------------------------------------------------
@dataclass
class LabModel:
    """A translator and its tokenizers, plus the same weights with positions switched off (claim C1)."""

    model: Transformer
    no_positions: Transformer
    source: SourceTokenizer
    target: TargetTokenizer
    trained: bool
    origin: str

    @classmethod
    def build(cls, model: Transformer, source: SourceTokenizer, target: TargetTokenizer, *,
              trained: bool, origin: str) -> LabModel:
        """Wrap `model` and copy its weights into a twin whose config has positions "none"."""
        model.eval()
        with torch.random.fork_rng(devices=[]):        # its random init is overwritten; leave the RNG alone
            twin = Transformer(model.cfg.replace(positions="none"))
        # A learned position table has no place in the twin; every other tensor is shared by name.
        state = {k: v for k, v in model.state_dict().items() if k in twin.state_dict()}
        twin.load_state_dict(state, strict=False)
        twin.eval()
        return cls(model, twin, source, target, trained, origin)

    def piece(self, token_id: int) -> str:
        """A target id as readable text: sub-word marks removed, specials by name (never raw bytes)."""
        if token_id < len(SPECIAL_TOKENS):
            return SPECIAL_TOKENS[token_id]
        token = self.target.id_to_token(token_id)
        if token is None:
            return f"<{token_id}>"
        text = self.target.tokenizer.decode([token_id]).strip()
        return text or token.replace("▁", " ").strip() or token


def _word_target_tokenizer(texts: list[str]) -> TargetTokenizer:
    """A word-level TargetTokenizer over `texts` (same pre-tokenizer and decoder as the trained BPE)."""
    pre = pre_tokenizers.Sequence([pre_tokenizers.Metaspace(), pre_tokenizers.Punctuation(behavior="isolated")])
    words: list[str] = list(SPECIAL_TOKENS)
    for text in texts:
        words += [w for w, _ in pre.pre_tokenize_str(text) if w not in words]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=SPECIAL_TOKENS[3]))
    tokenizer.pre_tokenizer = pre
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return TargetTokenizer(tokenizer)


def untrained_model(seed: int = UNTRAINED_SEED, why: str | None = None) -> LabModel:
    """A seeded, untrained tiny Transformer over the lesson's own units and words (for when no run exists).

    `why` (e.g. "runs/default does not exist") is appended to the model's origin shown on the page.
    """
    source_units = [u for u in examples.SOURCE_VOCAB if u not in (examples.PAD, examples.BOS, examples.EOS)]
    source = SourceTokenizer(Vocab(source_units))
    target = _word_target_tokenizer([DEFAULT_TARGET, "He gave me a book yesterday.", "I gave her a book.",
                                     "She smiled.", "she smiled."])
    cfg = ModelConfig.tiny(src_vocab=source.vocab_size, tgt_vocab=target.vocab_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Transformer(cfg)
    origin = f"untrained tiny model, torch seed {seed}" + (f"; {why}" if why else "")
    return LabModel.build(model, source, target, trained=False, origin=origin)


def load_model(model_dir: str | Path | None, *, required: bool = False) -> LabModel:
    """The trained translator in `model_dir`; without one, the seeded untrained model.

    `required`: the user named the folder, so a folder that cannot be loaded is a UsageError.
    """
    if model_dir is None:
        model_dir, required = DEFAULT_MODEL_DIR, False
    folder = Path(model_dir)
    if not folder.exists() and not required:
        return untrained_model(why=f"no trained model in {folder}")
    try:
        from ..translation.checkpoint import load_translator_parts
        model, source, target, _ = load_translator_parts(folder)
    except UsageError as error:
        if required:
            raise
        return untrained_model(why=str(error).split(";")[0])
    except (ValueError, KeyError, OSError) as error:
        if required:
            raise UsageError(f"--model {folder}: cannot load the translator: {error}") from None
        return untrained_model(why=f"{folder} could not be loaded")
    return LabModel.build(model, source, target, trained=True, origin=str(folder))


# ---- request checking --------------------------------------------------------------------------
def _check_keys(body: Any, allowed: dict[str, bool], where: str = "body") -> dict:
    """`body` must be a JSON object with only `allowed` keys (name -> required)."""
    if not isinstance(body, dict):
        raise ApiError(400, f"{where} must be a JSON object, got {type(body).__name__}", where)
    for key in body:
        if key not in allowed:
            raise ApiError(400, f"unknown field {key!r}; allowed: {', '.join(allowed)}", key)
    for key, required in allowed.items():
        if required and key not in body:
            raise ApiError(400, f"missing required field {key!r}", key)
    return body


def _round(value: float, digits: int = 6) -> float | None:
    value = float(value)
    return round(value, digits) if math.isfinite(value) else None


def _rows(t: torch.Tensor, digits: int = 6) -> list:
    """A tensor as nested lists of rounded floats (non-finite values become null)."""
    if t.dim() == 0:
        return _round(t.item(), digits)
    return [_rows(x, digits) for x in t]


def finite_json(value: Any) -> Any:
    """Replace NaN/inf anywhere in a JSON-able value by None (strict JSON has no such numbers)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def claim_view(claim_id: str) -> str | None:
    """Which view of the lab shows a claim (an anchor of the page), if any."""
    views = {"A": "#block", "B": "#block", "D": "#sentence", "E": "#masks", "G": "#block"}
    special = {"A1": "#sentence", "C1": "#sentence", "C2": "#sentence", "C3": "#block", "G2": "#sentence"}
    return special.get(claim_id, views.get(claim_id[:1]))


# ---- the API -----------------------------------------------------------------------------------
class LabAPI:
    """Every endpoint as a method; `handle(method, path, body)` routes a request to it."""

    def __init__(self, model: LabModel | None = None, *, model_dir: str | Path | None = None,
                 run_spec: Callable[[dict], dict] | None = None,
                 run_claims: Callable[[], list] | None = None) -> None:
        self._model = model
        self._model_dir = model_dir
        self._run_spec = run_spec
        self._run_claims = run_claims
        self.lock = threading.Lock()            # guards the shared model while it runs
        self._load_lock = threading.Lock()      # guards the lazily loaded model and the claims table
        self._verify_cache: dict | None = None

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

    # -- routing
    ROUTES: dict[str, tuple[str, str]] = {
        "/api/trace": ("POST", "trace"),
        "/api/block": ("GET", "block"),
        "/api/sentence": ("POST", "sentence"),
        "/api/masks": ("GET", "masks"),
        "/api/verify": ("GET", "verify"),
        "/api/patch": ("POST", "patch"),
        "/api/info": ("GET", "info"),
    }

    def handle(self, method: str, path: str, body: Any = None) -> dict:
        """Run the endpoint at `path`; raises ApiError 404 (unknown path) / 405 (wrong method) / 400."""
        route = self.ROUTES.get(path)
        if route is None:
            raise ApiError(404, f"no such endpoint: {path}", "path")
        want, name = route
        if method != want:
            raise ApiError(405, f"{path} takes {want}, not {method}", "method")
        return getattr(self, name)(body) if want == "POST" else getattr(self, name)()

    # -- POST /api/trace
    def trace(self, doc: Any) -> dict:
        """A trace-spec v1 document through `run_spec` (the function behind `glassformer trace`)."""
        run_spec = self._spec_runner()
        if not isinstance(doc, dict):
            raise ApiError(400, f"trace spec must be a JSON object, got {type(doc).__name__}", "body")
        try:
            return finite_json(run_spec(doc))
        except UsageError as error:
            raise ApiError(400, str(error), getattr(error, "field", None) or _field_of(str(error))) from None

    # -- GET /api/block
    def block(self) -> dict:
        """The lesson's BLOCK as a trace spec, the units its rows stand for, and the 2×3 exercise (unscaled)."""
        return {"spec": examples.block_spec(), "tokens": list(BLOCK_TOKENS),
                "exercise": examples.exercise_spec(scale=False)}

    # -- POST /api/sentence
    def sentence(self, body: Any) -> dict:
        """One sentence through the translator: every attention table and each target row's next tokens."""
        body = _check_keys(body, {"source": True, "target": False, "positions": False, "top_k": False})
        source = body["source"]
        if not isinstance(source, str) or not source.strip():
            raise ApiError(400, "source must be a non-empty string of Chinese text", "source")
        if len(source) > MAX_SOURCE_CHARS:
            raise ApiError(400, f"source is {len(source)} characters; the limit is {MAX_SOURCE_CHARS}", "source")
        target = body.get("target")
        if target is not None and not isinstance(target, str):
            raise ApiError(400, "target must be a string or null", "target")
        if target is not None and len(target) > MAX_TARGET_CHARS:
            raise ApiError(400, f"target is {len(target)} characters; the limit is {MAX_TARGET_CHARS}", "target")
        if target is not None and not target.strip():
            target = None
        positions = body.get("positions", True)
        if not isinstance(positions, bool):
            raise ApiError(400, "positions must be true or false", "positions")
        top_k = body.get("top_k", 5)
        if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= MAX_TOP_K:
            raise ApiError(400, f"top_k must be an integer in [1, {MAX_TOP_K}]", "top_k")

        lab = self.lab_model
        encoding = lab.source.analyse(source)
        if not encoding.units:
            raise ApiError(400, "source has no units after splitting", "source")
        limit = lab.model.cfg.max_len
        if len(encoding.units) > limit:
            raise ApiError(400, f"source has {len(encoding.units)} units; the model takes at most {limit}",
                           "source")
        target_ids = lab.target.encode(target) if target is not None else None
        if target_ids is not None and len(target_ids) + 1 > limit:
            raise ApiError(400, f"target has {len(target_ids)} tokens; the model takes at most {limit - 1}",
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
        with self._load_lock:
            if self._verify_cache is None:
                from ..lesson import claims
                table = claims.as_json((self._run_claims or claims.run_all)())
                for row in table["claims"]:
                    row["view"] = claim_view(row["id"])
                self._verify_cache = table
            return copy.deepcopy(self._verify_cache)

    # -- POST /api/patch
    def patch(self, body: Any) -> dict:
        """Activation patching at the `gave` row: each cross-attention head and encoder position, clean → corrupted."""
        from ..translation import patching
        body = _check_keys(body, {"clean": False, "corrupt": False, "target": False, "predict": False,
                                  "positions": False})
        corrupt = body.get("corrupt", [PATCH_CORRUPT])
        if isinstance(corrupt, str):
            corrupt = [corrupt]
        if not isinstance(corrupt, list) or not all(isinstance(c, str) for c in corrupt):
            raise ApiError(400, "corrupt must be a sentence or a list of sentences", "corrupt")
        positions = body.get("positions", True)
        if not isinstance(positions, bool):
            raise ApiError(400, "positions must be true or false", "positions")
        lab = self.lab_model
        try:
            with self.lock, torch.inference_mode():
                result = patching.lesson_patching(lab.model, lab.source, lab.target, body.get("clean", DEFAULT_SOURCE),
                                                  corrupt, body.get("target", DEFAULT_TARGET),
                                                  body.get("predict", patching.DEFAULT_PREDICT), positions=positions)
        except UsageError as error:
            message = str(error)
            field = message.split(":", 1)[0].split("[", 1)[0] if ":" in message else None
            raise ApiError(400, message, field if field in {"clean", "corrupt", "target", "predict", "positions"}
                           else None) from None
        return {"model": self.describe(lab), **finite_json(result)}

    # -- GET /api/info
    def info(self) -> dict:
        """What the Sentence view runs: trained or untrained, from where, with which sizes."""
        return {"glassformer": __version__, "model": self.describe(self.lab_model),
                "default_source": DEFAULT_SOURCE, "default_target": DEFAULT_TARGET, "patch_corrupt": PATCH_CORRUPT,
                "swap": list(SWAP_PAIR)}

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
                                                     "decoder_layers", "norm", "positions", "max_len")},
            "src_vocab": cfg.src_vocab,
            "tgt_vocab": cfg.tgt_vocab,
        }


def _field_of(message: str) -> str | None:
    """The field a one-line spec error names: the path before the first colon (plus a missing key)."""
    head = message.split(":", 1)[0].strip().split(" ")[0].strip("'\"`")
    if not head or not all(ch.isalnum() or ch in "._[]" for ch in head):
        return None
    missing = re.search(r"missing required key '([^']+)'", message)
    if missing:
        return missing.group(1) if head == "spec" else f"{head}.{missing.group(1)}"
    return head


ATTENTION_PROBES = ("encoder.*.self_attention.head.*.weights", "decoder.*.self_attention.head.*.weights",
                    "decoder.*.cross_attention.head.*.weights")


def _stack(trace: Recording, stack: str, part: str, layers: int, heads: int) -> list:
    """[layer][head] -> (query, key) weight table of sample 0, rounded."""
    return [[_rows(trace[f"{stack}.{i}.{part}.head.{h}.weights"][0]) for h in range(heads)]
            for i in range(layers)]


def _run_sentence(model: Transformer, lab: LabModel, source_ids: list[int], target_ids: list[int] | None,
                  top_k: int) -> dict:
    """Teacher-forced pass over BOS + target (greedy output when no target), traced for attention."""
    cfg = model.cfg
    src = torch.tensor([source_ids])                                            # (1, src)
    finished = True
    if target_ids is None:
        target_ids = greedy(model, src)[0]                                     # as `glassformer translate`
        limit = int(output_limits(model.source_padding(src), cfg.max_len)[0])
        finished = len(target_ids) < limit                                     # else it stopped at the limit
    tgt_in = torch.tensor([walk_inputs(target_ids, BOS, cfg.max_len, finished=finished)])   # (1, tgt)
    with model.probes(*ATTENTION_PROBES) as trace:
        logits = model(src, tgt_in)                                             # (1, tgt, vocab)
    # what each row should predict: the next target token, EOS after the last one, unless a greedy run
    # stopped at the length limit: then the last row's next token is simply the model's choice
    walk = next_token_walk(logits[0], tgt_in[0].tolist(), EOS, finished=finished, top=top_k)
    rows = [{"input": lab.piece(r.input_id), "next": lab.piece(r.next_id), "next_id": r.next_id,
             "next_prob": float(f"{r.p_next:.6g}"), "next_rank": r.rank,
             "top": [{"token": lab.piece(t), "id": t, "prob": float(f"{p:.6g}")} for t, p in r.top]}
            for r in walk]
    return {
        "target": [lab.piece(int(t)) for t in tgt_in[0]],
        "target_ids": tgt_in[0].tolist(),
        "translation": lab.target.decode(target_ids),
        "finished": finished,
        "layers": {"encoder": cfg.encoder_layers, "decoder": cfg.decoder_layers},
        "heads": cfg.heads,
        "encoder_self_attention": _stack(trace, "encoder", "self_attention", cfg.encoder_layers, cfg.heads),
        "decoder_self_attention": _stack(trace, "decoder", "self_attention", cfg.decoder_layers, cfg.heads),
        "cross_attention": _stack(trace, "decoder", "cross_attention", cfg.decoder_layers, cfg.heads),
        "next_tokens": rows,
        "pad_id": PAD,
    }
