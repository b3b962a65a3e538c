"""Training the Chinese->English translator: recipes, data preparation, the Noam schedule, the loop.

One loop serves one process and DDP (torchrun sets RANK/WORLD_SIZE/LOCAL_RANK). Each optimizer step
takes world_size x accumulate batches from one deterministic batch list; every rank runs its share
and the loss is divided by the step's GLOBAL target-token count, so the averaged gradient equals the
one a single process computes on the union of those batches. Only rank 0 writes files and logs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import UsageError
from ..inference.threads import training_threads
from ..model import ModelConfig, Transformer
from .batching import Example, collate, make_batches, rank_share, step_groups
from .checkpoint import (
    CONFIG,
    OPTIMIZER,
    STATE,
    VOCAB,
    average_into,
    load_optimizer,
    load_weights,
    read_json,
    rng_state,
    save_best,
    save_checkpoint,
    save_run_files,
    set_rng_state,
    write_json,
)
from .tokenize import SPECIAL_TOKENS, SourceTokenizer, TargetTokenizer, Vocab, is_han

SOURCE_UNITS = ("raw", "gold")
GLOSS_MAX_TOKENS = 10   # longer dictionary glosses are definitions, not translations: left out


@dataclass
class Recipe:
    """Everything that decides a training run besides the seed: model sizes and training knobs."""

    model: dict[str, Any]
    epochs: int = 40
    max_tokens: int = 4096          # padded tokens per batch (per rank)
    lr_factor: float = 1.0          # Noam: factor * d^-0.5 * min(step^-0.5, step * warmup^-1.5)
    warmup: int = 400
    label_smoothing: float = 0.1
    bpe_vocab: int = 2000           # target BPE vocabulary size
    glosses: bool = True            # add train-split CC-CEDICT word glosses as word-level pairs
    source_units: str = "raw"       # train on the raw-text segmentation ("raw") or the corpus's ("gold")
    average: int = 1                # average the last K epoch checkpoints at the end (1 = off)
    char_fallback: bool = False     # characters join the source vocabulary; sentences also train char-split
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


RECIPES: dict[str, Recipe] = {
    "tiny": Recipe(
        model=dict(d_model=32, heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0, max_len=64),
        epochs=1, max_tokens=512, lr_factor=1.0, warmup=50, bpe_vocab=300, glosses=False,
        note="for tests: seconds on a CPU"),
    "anchor": Recipe(
        model=dict(d_model=128, heads=4, d_ff=512, encoder_layers=2, decoder_layers=2, dropout=0.1,
                   max_len=128),
        epochs=30, max_tokens=1024, lr_factor=0.5, warmup=400, glosses=False, source_units="gold",
        note="the plain-Transformer anchor's sizes: gold segmentation, no glosses"),
    "default": Recipe(
        model=dict(d_model=128, heads=4, d_ff=512, encoder_layers=2, decoder_layers=2, dropout=0.3,
                   max_len=128),
        epochs=40, max_tokens=1024, lr_factor=0.5, warmup=400, bpe_vocab=2000, glosses=True,
        char_fallback=True, source_units="raw", average=5,
        note="the demo model: about 7 minutes on 2 idle CPU cores"),
}


# ---- data ----------------------------------------------------------------------------------
@dataclass
class Data:
    """Tokenizers, training examples and the dev pairs scored every epoch."""

    source: SourceTokenizer
    target: TargetTokenizer
    examples: list[Example]
    dev: list = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)


def prepare_data(recipe: Recipe, limit: int | None = None, vocab: dict | None = None,
                 dev_limit: int | None = None) -> Data:
    """Load the corpus, build (or restore) the tokenizers, encode the training pairs (+ glosses).

    Only the train split feeds the tokenizers and the examples; dev is kept for scoring.
    """
    from .corpus import load_corpus, train_glosses

    corpus = load_corpus()
    train = corpus.train[:limit] if limit else corpus.train
    glosses: dict[str, str] = {}
    if recipe.glosses:
        words = {u for p in train for u in p.zh_units}
        glosses = {w: g for w, g in sorted(train_glosses(corpus).items()) if w in words}
    if vocab is not None:
        source = SourceTokenizer.from_dict(vocab["source"])
        target = TargetTokenizer.from_dict(vocab["target"])
    else:
        source = SourceTokenizer.train([p.zh_units for p in train])
        target = TargetTokenizer.train([p.en for p in train] + list(glosses.values()), recipe.bpe_vocab)
    if recipe.char_fallback and vocab is None:
        source = with_characters(source, [p.zh_units for p in train])
    examples = []
    for p in train:
        units = p.zh_units if recipe.source_units == "gold" else source.segment(p.zh)
        examples.append(Example(source.vocab.encode(units), target.encode(p.en)))
        if recipe.char_fallback:
            chars = [c for u in units for c in (list(u) if all(map(is_han, u)) else [u])]
            if chars != units:
                examples.append(Example(source.vocab.encode(chars), target.encode(p.en)))
    n_glosses = 0
    for word, gloss in glosses.items():
        ids = target.encode(gloss)
        if len(ids) <= GLOSS_MAX_TOKENS:
            examples.append(Example(source.vocab.encode([word]), ids))
            n_glosses += 1
    max_len = recipe.model.get("max_len", 256)
    kept = [e for e in examples if e.width <= max_len]
    dev = corpus.dev[:dev_limit] if dev_limit else corpus.dev
    return Data(source, target, kept, dev,
                {"pairs": len(train), "glosses": n_glosses, "examples": len(kept),
                 "dropped_too_long": len(examples) - len(kept),
                 "target_tokens": sum(len(e.tgt) + 1 for e in kept)})


def with_characters(source: SourceTokenizer, unit_sequences) -> SourceTokenizer:
    """The same tokenizer plus every Han character of the training words as a unit of count 1.

    Known words keep their counts, so segmentation of known words is unchanged; an unknown word is
    then cut into known characters instead of falling back to <unk>.
    """
    words = source.vocab.tokens[len(SPECIAL_TOKENS):]
    chars = sorted({c for units in unit_sequences for u in units for c in u if is_han(c)} - set(words))
    counts = {**{c: 1 for c in chars}, **source.vocab.counts}
    return SourceTokenizer(Vocab(words + chars, counts), source.mode)


def noam_lr(step: int, d_model: int, factor: float, warmup: int) -> float:
    """lr = factor * d^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1."""
    step = max(step, 1)
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


class LossModule(nn.Module):
    """Wraps `Transformer.loss` as forward() so DistributedDataParallel sees it."""

    def __init__(self, model: Transformer, label_smoothing: float) -> None:
        super().__init__()
        self.model = model
        self.label_smoothing = label_smoothing

    def forward(self, src, tgt_in, labels):
        return self.model.loss(src, tgt_in, labels, self.label_smoothing)[0]


# ---- distributed ---------------------------------------------------------------------------
@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1


def init_distributed(device: torch.device) -> Dist:
    """Join the process group torchrun describes (gloo on CPU, nccl on CUDA); single process otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA device is available")
        return torch.device("cuda", local_rank)
    if name != "cpu":
        raise UsageError(f"--device must be auto, cpu or cuda, got {name!r}")
    return torch.device("cpu")


# ---- stopping ------------------------------------------------------------------------------
class StopFlag:
    """SIGINT/SIGTERM set a flag checked between steps, so a checkpoint is saved at a clean point.

    A second SIGINT raises KeyboardInterrupt at once.
    """

    def __init__(self) -> None:
        self.requested = False
        self._old: dict[int, Any] = {}

    def _handler(self, signum, frame) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> StopFlag:
        if _in_main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


# ---- the run -------------------------------------------------------------------------------
RECIPE_KEYS = ("epochs", "max_tokens", "lr_factor", "warmup", "label_smoothing", "bpe_vocab", "glosses",
               "source_units", "average", "char_fallback")


def resolve_args(args) -> dict[str, Any]:
    """Training settings: the preset's recipe, overridden by every option given on the command line."""
    if args.preset not in RECIPES:
        raise UsageError(f"--preset must be one of {', '.join(RECIPES)}, got {args.preset!r}")
    recipe = RECIPES[args.preset]
    settings: dict[str, Any] = {"preset": args.preset, "model": dict(recipe.model)}
    for key in RECIPE_KEYS:
        value = getattr(args, key, None)
        settings[key] = getattr(recipe, key) if value is None else value
    if getattr(args, "dropout", None) is not None:
        settings["model"]["dropout"] = args.dropout
    for key, fields in (("d_model", ("d_model",)), ("d_ff", ("d_ff",)), ("heads", ("heads",)),
                        ("layers", ("encoder_layers", "decoder_layers")), ("norm", ("norm",))):
        if getattr(args, key, None) is not None:
            settings["model"].update({f: getattr(args, key) for f in fields})
    settings["dropout"] = settings["model"].get("dropout", 0.1)
    for key in ("max_steps", "seed", "limit", "accumulate"):
        settings[key] = getattr(args, key, None)
    settings["seed"] = 1 if settings["seed"] is None else settings["seed"]
    settings["accumulate"] = settings["accumulate"] or 1
    _check_settings(settings)
    try:
        ModelConfig(**settings["model"])
    except ValueError as error:
        raise UsageError(str(error)) from None
    return settings


def _check_settings(s: dict[str, Any]) -> None:
    positive = ("epochs", "max_tokens", "warmup", "bpe_vocab", "accumulate", "average")
    for key in positive:
        if not isinstance(s[key], int) or s[key] < 1:
            raise UsageError(f"--{key.replace('_', '-')} must be a positive integer, got {s[key]!r}")
    if s["max_steps"] is not None and s["max_steps"] < 1:
        raise UsageError(f"--max-steps must be a positive integer, got {s['max_steps']!r}")
    if s["limit"] is not None and s["limit"] < 1:
        raise UsageError(f"--limit must be a positive integer, got {s['limit']!r}")
    if not s["lr_factor"] > 0:
        raise UsageError(f"--lr-factor must be positive, got {s['lr_factor']!r}")
    if not 0 <= s["label_smoothing"] < 1:
        raise UsageError(f"--label-smoothing must be in [0, 1), got {s['label_smoothing']!r}")
    if not 0 <= s["dropout"] < 1:
        raise UsageError(f"--dropout must be in [0, 1), got {s['dropout']!r}")
    if s["source_units"] not in SOURCE_UNITS:
        raise UsageError(f"--source-units must be one of {SOURCE_UNITS}, got {s['source_units']!r}")


def _recipe_of(settings: dict[str, Any]) -> Recipe:
    return Recipe(model=settings["model"], **{k: settings[k] for k in RECIPE_KEYS if k in settings})


class Trainer:
    """One training run in a run folder: build or resume, loop over epochs, evaluate, checkpoint."""

    def __init__(self, args) -> None:
        self.args = args
        self.out = Path(args.out or f"runs/{args.preset}")
        self.resume = bool(args.resume)
        if self.resume and (self.out / CONFIG).is_file():
            saved = read_json(self.out / CONFIG)
            self.settings = dict(saved["train"])
            for key in ("epochs", "max_steps", "average"):
                if getattr(args, key, None) is not None:
                    self.settings[key] = getattr(args, key)
            vocab = read_json(self.out / VOCAB)
        else:
            if self.resume and self.out.exists() and any(self.out.iterdir()):
                raise UsageError(f"--resume: {self.out} has no {CONFIG}; nothing to resume")
            if (self.out / CONFIG).exists():
                raise UsageError(f"{self.out} already holds a run: pass --resume to continue it, "
                                 "or choose another --out")
            self.resume = False
            self.settings = resolve_args(args)
            vocab = None
        self.keep = max(args.keep if args.keep is not None else 3, self.settings["average"])
        self.log_every = args.log_every or 10
        self.eval = not args.no_eval
        world = int(os.environ.get("WORLD_SIZE", "1"))
        torch.set_num_threads(training_threads(world, args.threads))       # the usable cores, shared by the ranks
        self.device = pick_device(args.device or "auto", int(os.environ.get("LOCAL_RANK", "0")))
        self.dist = init_distributed(self.device)
        torch.manual_seed(self.settings["seed"])
        self.recipe = _recipe_of(self.settings)
        self.data = prepare_data(self.recipe, self.settings["limit"], vocab)
        cfg_dict = dict(self.settings["model"], src_vocab=self.data.source.vocab_size,
                        tgt_vocab=self.data.target.vocab_size)
        self.cfg = ModelConfig.from_dict(read_json(self.out / CONFIG)["model"]) if self.resume \
            else ModelConfig(**cfg_dict)
        self.model = Transformer(self.cfg).to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9)
        self.state: dict[str, Any] = {"step": 0, "epoch": 0, "position": 0, "best_bleu": None,
                                      "best_step": None, "checkpoints": [], "seconds": 0.0}
        if self.resume:
            self._load()
        elif self.dist.main:
            save_run_files(self.out, self.cfg, self.settings, self.data.source, self.data.target)
        self.loss_module: nn.Module = LossModule(self.model, self.settings["label_smoothing"])
        if self.dist.active:
            from torch.nn.parallel import DistributedDataParallel

            self.loss_module = DistributedDataParallel(
                self.loss_module, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    # ---- state ---------------------------------------------------------------------------
    def _load(self) -> None:
        self.state = read_json(self.out / STATE)
        load_weights(self.model, self.out / "model.safetensors")
        load_optimizer(self.optimizer, self.out / OPTIMIZER, self.model)
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                for k, v in self.optimizer.state.get(p, {}).items():
                    if torch.is_tensor(v) and k != "step":
                        self.optimizer.state[p][k] = v.to(self.device)
        set_rng_state(self.state["rng"])

    def save(self) -> None:
        if self.dist.main:
            self.state["rng"] = rng_state()
            save_checkpoint(self.out, self.model, self.optimizer, self.state, keep=self.keep)
            self.state = read_json(self.out / STATE)

    def log(self, record: dict[str, Any]) -> None:
        if self.dist.main:
            with open(self.out / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    # ---- evaluation ----------------------------------------------------------------------
    def dev_score(self) -> dict[str, float] | None:
        if not self.eval or not self.data.dev:
            return None
        from .decode import Translator
        from .evaluate import evaluate_pairs

        self.model.eval()
        try:
            s = evaluate_pairs(Translator(self.model, self.data.source, self.data.target, self.device),
                               self.data.dev, input="raw", beam=1)
        finally:
            self.model.train()
        return {"dev_bleu": round(s.bleu, 2), "dev_chrf": round(s.chrf, 2)}

    # ---- the loop ------------------------------------------------------------------------
    def step_tokens(self, group: list[list[int]]) -> int:
        """Non-PAD labels of every batch in the step, on all ranks (known from the shared batch list)."""
        return sum(len(self.data.examples[i].tgt) + 1 for batch in group for i in batch)

    def train_step(self, group: list[list[int]]) -> tuple[float, int]:
        """One optimizer step on this rank's share of `group`; returns (summed loss over all ranks, tokens)."""
        step = self.state["step"] + 1
        lr = noam_lr(step, self.cfg.d_model, self.settings["lr_factor"], self.settings["warmup"])
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        accumulate = self.settings["accumulate"]
        total = self.step_tokens(group)
        self.optimizer.zero_grad(set_to_none=True)
        local = torch.zeros((), dtype=torch.float64)
        share = rank_share(group, self.dist.rank, accumulate)
        cuda = self.device.type == "cuda"
        for m, index in enumerate(share):
            batch = collate(self.data.examples, index).to(self.device)
            sync = contextlib.nullcontext()
            if self.dist.active and m < len(share) - 1:
                sync = self.loss_module.no_sync()
            with sync, torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=cuda):
                loss_sum = self.loss_module(batch.src, batch.tgt_in, batch.labels)
                (loss_sum * self.dist.world / total).backward()
            local += loss_sum.detach().double().cpu()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.state["step"] = step
        return float(local), total

    def _reduce(self, loss_sum: float, stop: bool) -> tuple[float, bool]:
        """Sum the loss over ranks and agree on stopping (any rank asked -> all stop at this step)."""
        if not self.dist.active:
            return loss_sum, stop
        import torch.distributed as dist

        t = torch.tensor([loss_sum, float(stop)], dtype=torch.float64,
                         device=self.device if self.device.type == "cuda" else "cpu")
        dist.all_reduce(t)
        return float(t[0]), bool(t[1] > 0)

    def run(self) -> int:
        """Train until the epochs (or --max-steps) are done or a stop is requested; 130 if interrupted."""
        s = self.settings
        epochs, max_steps = s["epochs"], s["max_steps"]
        groups_per_epoch = len(step_groups(make_batches(self.data.examples, s["max_tokens"], s["seed"], 0),
                                           self.dist.world, s["accumulate"]))
        total_steps = epochs * groups_per_epoch if max_steps is None else min(max_steps, epochs * groups_per_epoch)
        bar = None
        if self.dist.main and not getattr(self.args, "quiet", False):
            from tqdm import tqdm

            bar = tqdm(total=total_steps, initial=min(self.state["step"], total_steps), unit="step",
                       dynamic_ncols=True, mininterval=0.5 if sys.stderr.isatty() else 5.0,
                       file=sys.stderr)
        if self.dist.main:
            print(f"training {self.out}: {self.data.counts['examples']} examples "
                  f"({self.data.counts['pairs']} pairs + {self.data.counts['glosses']} glosses), "
                  f"{sum(p.numel() for p in self.model.parameters()):,} parameters, "
                  f"{groups_per_epoch} steps/epoch, device {self.device}, world {self.dist.world}",
                  file=sys.stderr)
        self.model.train()
        interrupted = False
        started = time.time()
        seconds0 = self.state.get("seconds", 0.0)
        self._cpu0, self._cpu_start = self.state.get("cpu_seconds", 0.0), time.process_time()
        window_tokens, window_time, window_loss = 0, time.time(), 0.0
        with StopFlag() as flag:
            while self.state["epoch"] < epochs:
                epoch = self.state["epoch"]
                groups = step_groups(make_batches(self.data.examples, s["max_tokens"], s["seed"], epoch),
                                     self.dist.world, s["accumulate"])
                epoch_loss, epoch_tokens = 0.0, 0
                while self.state["position"] < len(groups):
                    if max_steps is not None and self.state["step"] >= max_steps:
                        break
                    loss_sum, tokens = self.train_step(groups[self.state["position"]])
                    self.state["position"] += 1
                    loss_sum, stop = self._reduce(loss_sum, flag.requested)
                    epoch_loss += loss_sum
                    epoch_tokens += tokens
                    window_loss += loss_sum
                    window_tokens += tokens
                    step = self.state["step"]
                    lr = self.optimizer.param_groups[0]["lr"]
                    if step % self.log_every == 0 or stop:
                        now = time.time()
                        rate = window_tokens / max(now - window_time, 1e-9)
                        self.log({"kind": "step", "step": step, "epoch": epoch, "loss": loss_sum / tokens,
                                  "window_loss": window_loss / window_tokens, "lr": lr, "tokens": tokens,
                                  "tokens_per_s": round(rate, 1)})
                        if bar is not None:
                            bar.set_postfix(epoch=epoch + 1, loss=f"{window_loss / window_tokens:.3f}",
                                            tok_s=f"{rate:.0f}", lr=f"{lr:.2e}", refresh=False)
                        window_tokens, window_time, window_loss = 0, now, 0.0
                    if bar is not None:
                        bar.update(1)
                    if stop:
                        interrupted = True
                        break
                if interrupted or (max_steps is not None and self.state["step"] >= max_steps
                                   and self.state["position"] < len(groups)):
                    break
                self.state["epoch"] += 1
                self.state["position"] = 0
                self.end_epoch(epoch, epoch_loss / max(epoch_tokens, 1), started, seconds0)
                window_tokens, window_time, window_loss = 0, time.time(), 0.0
                if max_steps is not None and self.state["step"] >= max_steps:
                    break
            self.state["seconds"] = seconds0 + time.time() - started
            if bar is not None:
                bar.close()
            if interrupted:
                self.save()
                if self.dist.main:
                    print(f"interrupted at step {self.state['step']}: checkpoint saved in {self.out} "
                          "(continue with --resume)", file=sys.stderr)
                self._finish()
                return 130
            self.save()
            if self.state["epoch"] >= epochs and s["average"] > 1:
                self.average_last()
        if self.dist.main:
            self.summary()
        self._finish()
        return 0

    def end_epoch(self, epoch: int, train_loss: float, started: float, seconds0: float) -> None:
        """Dev BLEU (rank 0), metrics line, checkpoint, best/."""
        record: dict[str, Any] = {"kind": "epoch", "epoch": epoch + 1, "step": self.state["step"],
                                  "train_loss": round(train_loss, 4)}
        if self.dist.main:
            scores = self.dev_score()
            if scores:
                record.update(scores)
            self.state["seconds"] = seconds0 + time.time() - started
            record["seconds"] = round(self.state["seconds"], 1)
            self.state["cpu_seconds"] = self._cpu0 + time.process_time() - self._cpu_start
            record["cpu_seconds"] = round(self.state["cpu_seconds"], 1)
            self.log(record)
            best = self.state.get("best_bleu")
            improved = scores is not None and (best is None or scores["dev_bleu"] > best)
            if improved:
                self.state["best_bleu"], self.state["best_step"] = scores["dev_bleu"], self.state["step"]
            self.save()
            if improved:
                save_best(self.out, self.model, {**self.state, "dev": scores})
        self._barrier()

    def average_last(self) -> None:
        """Average the last K epoch checkpoints; keep the result in best/ if it scores higher on dev."""
        if not self.dist.main:
            return
        names = self.state.get("checkpoints", [])[-self.settings["average"]:]
        if len(names) < 2:
            return
        paths = [self.out / "checkpoints" / n / "model.safetensors" for n in names]
        latest = {k: v.clone() for k, v in self.model.state_dict().items()}
        average_into(self.model, paths)
        scores = self.dev_score()
        record = {"kind": "average", "checkpoints": names, **(scores or {})}
        self.log(record)
        best = self.state.get("best_bleu")
        if scores is not None and (best is None or scores["dev_bleu"] >= best):
            self.state["best_bleu"], self.state["best_step"] = scores["dev_bleu"], f"average of {names}"
            save_best(self.out, self.model, {**self.state, "dev": scores, "averaged": names})
            write_json(self.out / STATE, {**self.state, "rng": rng_state()})
        self.model.load_state_dict(latest)

    def summary(self) -> None:
        secs = self.state.get("seconds", 0.0)
        lines = [json.loads(x) for x in (self.out / "metrics.jsonl").read_text().splitlines() if x.strip()] \
            if (self.out / "metrics.jsonl").exists() else []
        rates = [r["tokens_per_s"] for r in lines if r.get("kind") == "step"]
        rate = sorted(rates)[len(rates) // 2] if rates else float("nan")
        print(f"done: {self.state['step']} steps in {secs:.0f} s (median {rate:.0f} target tokens/s); "
              f"best dev BLEU {self.state.get('best_bleu')} ({self.state.get('best_step')}); model in {self.out}",
              file=sys.stderr)

    def _barrier(self) -> None:
        if self.dist.active:
            import torch.distributed as dist

            dist.barrier()

    def _finish(self) -> None:
        if self.dist.active:
            import torch.distributed as dist

            dist.barrier()
            dist.destroy_process_group()


def train(args) -> int:
    """Run training from parsed arguments (see commands.add_train_arguments)."""
    return Trainer(args).run()


def main(argv: list[str] | None = None) -> None:
    """`python -m glassformer.train ...` (the torchrun entry point): same options as `glassformer train`."""
    import argparse

    from .commands import add_train_arguments

    parser = argparse.ArgumentParser(prog="python -m glassformer.train", description=__doc__.splitlines()[0])
    add_train_arguments(parser)
    args = parser.parse_args(argv)
    try:
        code = train(args)
    except UsageError as error:
        print(f"glassformer train: error: {error}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print("glassformer train: interrupted", file=sys.stderr)
        code = 130
    sys.exit(code)


__all__ = ["RECIPES", "Recipe", "Trainer", "main", "noam_lr", "prepare_data", "train"]
