"""Training the Chinese->English translator: the loss and the loop (the Noam schedule: schedule.py; settings:
settings.py, presets: presets.py, their data: prepare_data.py).

One loop serves one process and DDP (torchrun sets RANK/WORLD_SIZE/LOCAL_RANK). Each optimizer step
takes world_size x accumulate batches from one deterministic batch list; every rank runs its share
and the loss is divided by the step's GLOBAL target-token count, so the averaged gradient equals the
one a single process computes on the union of those batches. Only rank 0 writes files and logs.

A run, as the methods read: `run` announces it and loops `train_epoch` over the epochs; `train_epoch`
calls `step` for each optimizer step (forward + loss under the run's precision, backward, clip, Adam,
the schedule) and `log_step` every --log-every steps; `end_epoch` scores dev (`evaluate`), logs and
`save`s; at the end `average_last` averages the last epochs into best/.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import Any

import torch
from torch import nn

from ..data.batching import Example, collate, drop_words, make_batches, rank_share, step_groups
from ..data.checkpoint import (
    CONFIG,
    METRICS,
    MODEL,
    STATE,
    average_into,
    read_json,
    rng_state,
    save_best,
    save_checkpoint,
    save_run_files,
    step_folder,
    write_json,
)
from ..data.pieces import PieceDropout, cut_step
from ..errors import UsageError
from ..inference.precision import precision_note
from ..model import ModelConfig, Transformer
from ..options import pick_device
from ..threads import training_threads
from .prepare_data import Data, build_source_tokenizer, prepare_data
from .presets import PRESETS
from .resume import gathered_rng, load_checkpoint, open_run, trim_metrics
from .runtime import StopFlag, compiled_step, init_distributed
from .schedule import noam_schedule
from .settings import TrainSettings, run_options

Recipe = TrainSettings      # what prepare_data reads: the settings of a run

ESTIMATE_AFTER = 60         # steps of this invocation after which the measured time estimate is printed


class LossModule(nn.Module):
    """Wraps `Transformer.loss_sum` as forward() so DistributedDataParallel (and torch.compile) see it."""

    def __init__(self, model: Transformer, label_smoothing: float) -> None:
        super().__init__()
        self.model, self.label_smoothing = model, label_smoothing

    def forward(self, src, tgt_in, labels):
        return self.model.loss_sum(src, tgt_in, labels, self.label_smoothing)


def estimate_line(progress: dict[str, Any]) -> str:
    """The run's remaining time from the progress bar's own numbers (tqdm's format_dict): the seconds per
    step of this invocation so far, times the steps left."""
    done = progress["n"] - progress.get("initial", 0)
    per_step = progress["elapsed"] / max(done, 1)
    left = max(progress["total"] - progress["n"], 0)
    return (f"estimate: {per_step * 1000:.0f} ms per step on this machine, {left:,} steps left: "
            f"about {per_step * left / 60:.0f} min of training, plus a dev score per epoch")


# ---- the run -------------------------------------------------------------------------------
class Trainer:
    """One training run in a run folder: build or resume, loop over epochs, evaluate, checkpoint."""

    def __init__(self, args) -> None:
        self.options = run_options(args)
        self.out, self.resume = self.options.out, self.options.resume
        self.settings, vocab = open_run(self.out, self.resume, args)   # saved settings on --resume
        self.keep = max(self.options.keep, self.settings.average)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        torch.set_num_threads(training_threads(world, self.options.threads))   # the usable cores, shared by ranks
        self.device = pick_device(self.options.device, int(os.environ.get("LOCAL_RANK", "0")))
        self.dist = init_distributed(self.device)
        torch.manual_seed(self.settings.seed)
        self.data = prepare_data(self.settings, self.settings.limit, vocab)
        self.examples = self.data.examples          # this epoch's examples (see examples_for)
        self._pieces = PieceDropout(self.data.target)   # --bpe-dropout's cutter
        self.cfg = ModelConfig.from_dict(read_json(self.out / CONFIG)["model"]) if self.resume else ModelConfig(
            **self.settings.model.model_dump(), src_vocab=self.data.source.vocab_size,
            tgt_vocab=self.data.target.vocab_size)
        self.model = Transformer(self.cfg).to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
        self.state: dict[str, Any] = {"step": 0, "epoch": 0, "position": 0, "best_bleu": None,
                                      "best_step": None, "checkpoints": [], "seconds": 0.0}
        if self.resume:
            self._load()
        elif self.dist.main:
            save_run_files(self.out, self.cfg, self.settings.to_dict(), self.data.source, self.data.target)
        s = self.settings
        self.schedule = noam_schedule(self.optimizer, self.cfg.d_model, s.lr_factor, s.warmup, self.state["step"],
                                      self.total_steps(capped=False), s.cooldown)
        self.loss_module: nn.Module = LossModule(self.model, s.label_smoothing)
        if self.dist.active:
            from torch.nn.parallel import DistributedDataParallel

            self.loss_module = DistributedDataParallel(
                self.loss_module, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        self.loss_module = compiled_step(self.loss_module, self.options.compile)
        self.interrupted, self._stop = False, StopFlag()          # Ctrl-C / SIGTERM: stop at a clean step
        self._rng_ranks: list | None = None                        # every rank's random state (DDP), for `save`

    # ---- state ----------------------------------------------------------------------------
    def _load(self) -> None:
        self.state = load_checkpoint(self.out, self.model, self.optimizer, self.device, self.dist) or self.state
        if self.dist.main:                                 # the lines of steps it redoes, logged again
            trim_metrics(self.out, self.state["step"])

    def gather_rng(self) -> None:
        """Every rank's random state for rank 0's next `save` (every rank calls this)."""
        self._rng_ranks = gathered_rng(self.dist)

    def save(self) -> None:
        """The checkpoint of this step (rank 0, after every rank's `gather_rng`); the state keeps the names of
        the last `keep` ones."""
        if self.dist.main:
            self.state["rng"] = rng_state()
            if self._rng_ranks is not None:
                self.state["rng_ranks"] = self._rng_ranks
            name = save_checkpoint(self.out, self.model, self.optimizer, self.state, keep=self.keep).name
            recent = [c for c in self.state["checkpoints"] if c != name] + [name]
            self.state["checkpoints"] = recent[-self.keep:] if self.keep > 0 else []

    def log(self, record: dict[str, Any]) -> None:
        if self.dist.main:
            with open(self.out / METRICS, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    def account_time(self) -> None:
        """Wall-clock and CPU seconds of the run so far, over every invocation."""
        self.state["seconds"] = self._seconds0 + time.time() - self._started
        self.state["cpu_seconds"] = self._cpu0 + time.process_time() - self._cpu_start

    # ---- evaluation ----------------------------------------------------------------------
    def evaluate(self) -> dict[str, float] | None:
        """Dev BLEU and chrF, greedy on raw input (None with --no-eval)."""
        if not self.settings.eval or not self.data.dev:
            return None
        from ..decoding.evaluate import evaluate_pairs
        from ..decoding.translator import Translator

        self.model.eval()
        try:
            s = evaluate_pairs(Translator(self.model, self.data.source, self.data.target, self.device),
                               self.data.dev, input="raw", beam=1)
        finally:
            self.model.train()
        return {"dev_bleu": round(s.bleu, 2), "dev_chrf": round(s.chrf, 2)}

    # ---- the steps -----------------------------------------------------------------------
    def examples_for(self, epoch: int) -> list:
        """The examples of an epoch: all of them, or the HSK ones alone in the last `hsk_finish` epochs."""
        finishing = self.settings.hsk_finish and epoch >= self.settings.epochs - self.settings.hsk_finish
        return self.data.finish if finishing and self.data.finish else self.data.examples

    def epoch_groups(self, epoch: int) -> list[list[list[int]]]:
        """The optimizer steps of an epoch (batches of example indices), the same on every rank."""
        s = self.settings
        return step_groups(make_batches(self.examples_for(epoch), s.max_tokens, s.seed, epoch),
                           self.dist.world, s.accumulate)

    def total_steps(self, capped: bool = True) -> int:
        """Optimizer steps of the whole run (the last epochs may train on the HSK examples only); `capped`:
        at most --max-steps (the schedule's cool-down is planned over the epochs, uncapped: --max-steps
        stops a run as an interruption would, and a resume past it continues the same schedule)."""
        epochs = self.settings.epochs
        sizes = {id(self.data.examples): len(self.epoch_groups(0)),
                 id(self.data.finish): len(self.epoch_groups(epochs - 1))}
        total = sum(sizes[id(self.examples_for(epoch))] for epoch in range(epochs))
        return total if self.settings.max_steps is None or not capped else min(self.settings.max_steps, total)

    def step_examples(self, group: list[list[int]]) -> dict[int, Example]:
        """The examples of every batch in the step, on all ranks; with --bpe-dropout their targets cut again
        (data/pieces.py), seeded by (seed, step, example)."""
        p = self.settings.bpe_dropout
        if p <= 0:
            return {i: self.examples[i] for batch in group for i in batch}
        return cut_step(self.examples, group, self._pieces, p, f"{self.settings.seed}:{self.state['step']}",
                        self.settings.model.max_len)

    def precision(self):
        """bfloat16: autocast around forward and loss (weights, gradients and Adam stay fp32; the loss
        itself is computed in fp32 by Transformer.loss). float32: nothing."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.settings.dtype == "bfloat16")

    def step(self, group: list[list[int]]) -> tuple[float, int, float]:
        """One optimizer step on this rank's share of `group`: (summed loss over all ranks, tokens, lr)."""
        lr = self.schedule.get_last_lr()[0]
        examples = self.step_examples(group)
        total = sum(len(examples[i].tgt) + 1 for batch in group for i in batch)   # non-PAD labels, all ranks
        self.optimizer.zero_grad(set_to_none=True)
        local = torch.zeros((), dtype=torch.float64)
        share = rank_share(group, self.dist.rank, self.settings.accumulate)
        for m, index in enumerate(share):
            batch = collate(examples, index)
            batch.src = drop_words(batch.src, self.settings.word_dropout)
            batch = batch.to(self.device)
            last = m == len(share) - 1
            with self.loss_module.no_sync() if self.dist.active and not last else contextlib.nullcontext():
                with self.precision():
                    loss_sum = self.loss_module(batch.src, batch.tgt_in, batch.labels)
                (loss_sum * self.dist.world / total).backward()
            local += loss_sum.detach().double().cpu()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.schedule.step()
        self.state["step"] += 1
        loss_sum, stop = self.dist.agree(float(local), self._stop.requested, self.device)
        self.interrupted = self.interrupted or stop
        return loss_sum, total, lr

    def log_step(self, epoch: int, loss_sum: float, tokens: int, lr: float) -> None:
        """A metrics.jsonl line every --log-every steps (and at a stop): this step's loss and the window's."""
        self._window["loss"] += loss_sum
        self._window["tokens"] += tokens
        step = self.state["step"]
        if step % self.settings.log_every and not self.interrupted:
            return
        now, window = time.time(), self._window
        rate = window["tokens"] / max(now - window["since"], 1e-9)
        self.log({"kind": "step", "step": step, "epoch": epoch, "loss": loss_sum / tokens,
                  "window_loss": window["loss"] / window["tokens"], "lr": lr, "tokens": tokens,
                  "tokens_per_s": round(rate, 1)})
        self.bar.set_postfix(epoch=epoch + 1, loss=f"{window['loss'] / window['tokens']:.3f}", tok_s=f"{rate:.0f}",
                             lr=f"{lr:.2e}", refresh=False)
        self._new_window()

    def _new_window(self) -> None:
        self._window = {"loss": 0.0, "tokens": 0, "since": time.time()}

    def reached_max_steps(self) -> bool:
        return self.settings.max_steps is not None and self.state["step"] >= self.settings.max_steps

    def train_epoch(self) -> bool:
        """The steps of the current epoch from where it stands; True when every one of them ran (not
        stopped by Ctrl-C / SIGTERM or --max-steps)."""
        epoch = self.state["epoch"]
        groups = self.epoch_groups(epoch)
        self.examples = self.examples_for(epoch)
        self._epoch = {"loss": 0.0, "tokens": 0}
        while self.state["position"] < len(groups):
            if self.reached_max_steps():
                return False
            loss_sum, tokens, lr = self.step(groups[self.state["position"]])
            self.state["position"] += 1
            self._epoch["loss"] += loss_sum
            self._epoch["tokens"] += tokens
            self.log_step(epoch, loss_sum, tokens, lr)
            self.bar.update(1)
            if self.state["step"] - self._first_step == ESTIMATE_AFTER and not self.bar.disable:
                self.bar.write(estimate_line(self.bar.format_dict), file=sys.stderr)
            if self.interrupted:
                return False
        return True

    # ---- the loop ------------------------------------------------------------------------
    def announce(self) -> None:
        if not self.dist.main:
            return
        counts = self.data.counts
        print(f"training {self.out}: {counts['examples']} examples ({counts['pairs']} pairs + {counts['glosses']} "
              f"glosses), {sum(p.numel() for p in self.model.parameters()):,} parameters, "
              f"{len(self.epoch_groups(0))} steps/epoch, device {self.device}, world {self.dist.world}, "
              f"{self.settings.dtype}", file=sys.stderr)
        if self.device.type == "cpu" and (slow := precision_note(self.settings.dtype, subject="training")):
            print(slow, file=sys.stderr)
        note = PRESETS.get(self.settings.preset, {}).get("note")
        if note:
            print(f"preset {self.settings.preset}: {note}", file=sys.stderr)

    def run(self) -> int:
        """Train until the epochs (or --max-steps) are done or a stop is requested; 130 if interrupted."""
        from tqdm import tqdm

        total = self.total_steps()
        self.announce()
        self.bar = tqdm(total=total, initial=min(self.state["step"], total), unit="step", dynamic_ncols=True,
                        mininterval=0.5 if sys.stderr.isatty() else 5.0, file=sys.stderr,
                        disable=not self.dist.main or self.options.quiet)
        self.model.train()
        self._started, self._seconds0 = time.time(), self.state.get("seconds", 0.0)
        self._cpu0, self._cpu_start = self.state.get("cpu_seconds", 0.0), time.process_time()
        self._first_step = self.state["step"]
        self._new_window()
        with self._stop:
            while self.state["epoch"] < self.settings.epochs and not self.reached_max_steps():
                if not self.train_epoch():
                    break
                self.end_epoch()
            self.account_time()
            self.bar.close()
            self.gather_rng()
            self.save()
            if self.interrupted:
                if self.dist.main:
                    print(f"interrupted at step {self.state['step']}: checkpoint saved in {self.out} "
                          "(continue with --resume)", file=sys.stderr)
                self.dist.close()
                return 130
            if self.state["epoch"] >= self.settings.epochs and (self.settings.average > 1 or self.settings.cooldown):
                self.average_last()
        if self.dist.main:
            self.summary()
        self.dist.close()
        return 0

    def end_epoch(self) -> None:
        """The epoch is done: dev score (rank 0), metrics line, checkpoint, best/."""
        epoch, self.state["epoch"], self.state["position"] = self.state["epoch"], self.state["epoch"] + 1, 0
        record: dict[str, Any] = {"kind": "epoch", "epoch": epoch + 1, "step": self.state["step"],
                                  "train_loss": round(self._epoch["loss"] / max(self._epoch["tokens"], 1), 4)}
        scores = self.evaluate() if self.dist.main else None
        self.gather_rng()                                  # every rank, after rank 0's evaluation
        if self.dist.main:
            self.account_time()
            self.log({**record, **(scores or {}), "seconds": round(self.state["seconds"], 1),
                      "cpu_seconds": round(self.state["cpu_seconds"], 1)})
            best = self.state.get("best_bleu")
            improved = scores is not None and (best is None or scores["dev_bleu"] > best)
            if improved:
                self.state["best_bleu"], self.state["best_step"] = scores["dev_bleu"], self.state["step"]
            self.save()
            if improved:
                save_best(self.out, self.model, {**self.state, "dev": scores})
        self.dist.barrier()
        self._new_window()

    def average_last(self) -> None:
        """Average the last K epoch checkpoints into best/: the run's model (its dev score is logged); K = 1
        with a cool-down: the last, annealed weights. Kept whatever one dev score says: on 232 short dev
        sentences single epochs differ by a BLEU point by chance (docs/translator.md)."""
        if not self.dist.main:
            return
        names = self.state.get("checkpoints", [])[-self.settings.average:]
        if not names:
            return
        paths = [step_folder(self.out, n) / MODEL for n in names]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise UsageError(f"{missing[0]}: a checkpoint state.json lists is not there; nothing averaged")
        latest = {k: v.clone() for k, v in self.model.state_dict().items()}
        average_into(self.model, paths)
        scores = self.evaluate()
        record = {"kind": "average", "checkpoints": names, **(scores or {})}
        self.log(record)
        self.state["best_bleu"] = scores["dev_bleu"] if scores else None
        self.state["best_step"] = f"average of {names}" if len(names) > 1 else names[0]
        save_best(self.out, self.model, {**self.state, "dev": scores, "averaged": names})
        write_json(self.out / STATE, {**self.state, "rng": rng_state()})
        self.model.load_state_dict(latest)

    def summary(self) -> None:
        secs = self.state.get("seconds", 0.0)
        lines = [json.loads(x) for x in (self.out / METRICS).read_text().splitlines() if x.strip()] \
            if (self.out / METRICS).exists() else []
        rates = [r["tokens_per_s"] for r in lines if r.get("kind") == "step"]
        rate = sorted(rates)[len(rates) // 2] if rates else float("nan")
        print(f"done: {self.state['step']} steps in {secs:.0f} s (median {rate:.0f} target tokens/s); "
              f"best dev BLEU {self.state.get('best_bleu')} ({self.state.get('best_step')}); model in {self.out}",
              file=sys.stderr)


def train(args) -> int:
    """Run training from parsed arguments (see training/commands.py's add_train_arguments)."""
    return Trainer(args).run()


__all__ = ["Data", "Recipe", "Trainer", "build_source_tokenizer", "estimate_line", "prepare_data", "train"]
