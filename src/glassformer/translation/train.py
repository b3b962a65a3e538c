"""Training the Chinese->English translator: the Noam schedule, the loss, the loop (recipes: recipes.py).

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
import sys
import time
from typing import Any

import torch
from torch import nn

from ..errors import UsageError
from ..inference.threads import training_threads
from ..model import ModelConfig, Transformer
from ..validation import validate
from .batching import collate, make_batches, rank_share, step_groups
from .checkpoint import (
    CONFIG,
    OPTIMIZER,
    STATE,
    VOCAB,
    ConfigFile,
    average_into,
    load_optimizer,
    load_weights,
    read_json,
    read_run_json,
    rng_state,
    save_best,
    save_checkpoint,
    save_run_files,
    set_rng_state,
    write_json,
)
from .recipes import RECIPES, Data, Recipe, build_source_tokenizer, prepare_data
from .runtime import StopFlag, init_distributed, pick_device
from .settings import TrainSettings, resolve_settings, resumed_settings, run_options

__all__ = ["RECIPES", "Data", "Recipe", "Trainer", "build_source_tokenizer", "noam_lr", "prepare_data", "train"]


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


class Estimate:
    """The run's remaining time, measured on this machine: seconds per step over steps 11-60 of this
    invocation (the first ten warm up), times the steps left. Printed once, early."""

    WARM, MEASURED = 10, 50

    def __init__(self, start_step: int, total_steps: int) -> None:
        self.start, self.total = start_step, total_steps
        self.t0: float | None = None

    def update(self, step: int) -> str | None:
        done = step - self.start
        if done == self.WARM:
            self.t0 = time.perf_counter()
        if done != self.WARM + self.MEASURED or self.t0 is None:
            return None
        per_step = (time.perf_counter() - self.t0) / self.MEASURED
        left = max(self.total - step, 0)
        return (f"estimate: {per_step * 1000:.0f} ms per step on this machine, {left:,} steps left: "
                f"about {per_step * left / 60:.0f} min of training, plus a dev score per epoch")


# ---- the run -------------------------------------------------------------------------------
def _recipe_of(settings: TrainSettings) -> Recipe:
    names = {f.name for f in dataclasses.fields(Recipe)} - {"model", "note"}
    values = settings.to_dict()
    return Recipe(model=values["model"], **{k: values[k] for k in names if k in values})


class Trainer:
    """One training run in a run folder: build or resume, loop over epochs, evaluate, checkpoint."""

    def __init__(self, args) -> None:
        self.args = args
        self.options = run_options(args)
        self.out, self.resume = self.options.out, self.options.resume
        if self.resume and not (self.out / CONFIG).is_file():
            raise UsageError(f"--resume: {self.out} holds no run (no {CONFIG}); nothing to resume — "
                             "leave out --resume to start one")
        if self.resume:
            saved = validate(ConfigFile, read_run_json(self.out / CONFIG, "MAX_CONFIG_BYTES"), str(self.out / CONFIG))
            self.settings = resumed_settings(saved.train, args, f"{self.out / CONFIG}: train")
            vocab = read_run_json(self.out / VOCAB, "MAX_VOCAB_BYTES")
        else:
            if (self.out / CONFIG).exists():
                raise UsageError(f"{self.out} already holds a run: pass --resume to continue it, "
                                 "or choose another --out")
            self.settings = resolve_settings(args)
            vocab = None
        self.keep = max(self.options.keep if self.options.keep is not None else 3, self.settings.average)
        self.log_every = self.settings.log_every
        self.eval = self.settings.eval
        world = int(os.environ.get("WORLD_SIZE", "1"))
        torch.set_num_threads(training_threads(world, args.threads))       # the usable cores, shared by the ranks
        self.device = pick_device(args.device or "auto", int(os.environ.get("LOCAL_RANK", "0")))
        self.dist = init_distributed(self.device)
        torch.manual_seed(self.settings.seed)
        self.recipe = _recipe_of(self.settings)
        self.data = prepare_data(self.recipe, self.settings.limit, vocab)
        self.examples = self.data.examples          # this epoch's examples (see examples_for)
        cfg_dict = dict(self.settings.model, src_vocab=self.data.source.vocab_size,
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
            save_run_files(self.out, self.cfg, self.settings.to_dict(), self.data.source, self.data.target)
        self.loss_module: nn.Module = LossModule(self.model, self.settings.label_smoothing)
        if self.dist.active:
            from torch.nn.parallel import DistributedDataParallel

            self.loss_module = DistributedDataParallel(
                self.loss_module, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    # ---- state ---------------------------------------------------------------------------
    def _load(self) -> None:
        self.state = read_json(self.out / STATE)
        load_weights(self.model, self.out / "model.safetensors")
        load_optimizer(self.optimizer, self.out / OPTIMIZER)
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
        from .evaluate import evaluate_pairs
        from .translator import Translator

        self.model.eval()
        try:
            s = evaluate_pairs(Translator(self.model, self.data.source, self.data.target, self.device),
                               self.data.dev, input="raw", beam=1)
        finally:
            self.model.train()
        return {"dev_bleu": round(s.bleu, 2), "dev_chrf": round(s.chrf, 2)}

    # ---- the loop ------------------------------------------------------------------------
    def examples_for(self, epoch: int) -> list:
        """The examples of an epoch: all of them, or the HSK ones alone in the last `hsk_finish` epochs."""
        finishing = self.settings.hsk_finish and epoch >= self.settings.epochs - self.settings.hsk_finish
        return self.data.finish if finishing and self.data.finish else self.data.examples

    def epoch_groups(self, epoch: int) -> list[list[list[int]]]:
        """The optimizer steps of an epoch (batches of example indices), the same on every rank."""
        s = self.settings
        return step_groups(make_batches(self.examples_for(epoch), s.max_tokens, s.seed, epoch),
                           self.dist.world, s.accumulate)

    def step_tokens(self, group: list[list[int]]) -> int:
        """Non-PAD labels of every batch in the step, on all ranks (known from the shared batch list)."""
        return sum(len(self.examples[i].tgt) + 1 for batch in group for i in batch)

    def train_step(self, group: list[list[int]]) -> tuple[float, int]:
        """One optimizer step on this rank's share of `group`; returns (summed loss over all ranks, tokens)."""
        step = self.state["step"] + 1
        lr = noam_lr(step, self.cfg.d_model, self.settings.lr_factor, self.settings.warmup)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        accumulate = self.settings.accumulate
        total = self.step_tokens(group)
        self.optimizer.zero_grad(set_to_none=True)
        local = torch.zeros((), dtype=torch.float64)
        share = rank_share(group, self.dist.rank, accumulate)
        cuda = self.device.type == "cuda"
        for m, index in enumerate(share):
            batch = collate(self.examples, index).to(self.device)
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
        epochs, max_steps = s.epochs, s.max_steps
        sizes = {id(self.data.examples): len(self.epoch_groups(0)),
                 id(self.data.finish): len(self.epoch_groups(epochs - 1))}           # the last epoch may finish
        per_epoch = [sizes[id(self.examples_for(epoch))] for epoch in range(epochs)]
        groups_per_epoch = per_epoch[0]
        total_steps = sum(per_epoch) if max_steps is None else min(max_steps, sum(per_epoch))
        if self.dist.main:
            print(f"training {self.out}: {self.data.counts['examples']} examples "
                  f"({self.data.counts['pairs']} pairs + {self.data.counts['glosses']} glosses), "
                  f"{sum(p.numel() for p in self.model.parameters()):,} parameters, "
                  f"{groups_per_epoch} steps/epoch, device {self.device}, world {self.dist.world}",
                  file=sys.stderr)
            note = RECIPES[s.preset].note if s.preset in RECIPES else ""
            if note:
                print(f"preset {s.preset}: {note}", file=sys.stderr)
        bar = None
        if self.dist.main and not self.options.quiet:
            from tqdm import tqdm

            bar = tqdm(total=total_steps, initial=min(self.state["step"], total_steps), unit="step",
                       dynamic_ncols=True, mininterval=0.5 if sys.stderr.isatty() else 5.0,
                       file=sys.stderr)
        self.model.train()
        interrupted = False
        started = time.time()
        seconds0 = self.state.get("seconds", 0.0)
        self._cpu0, self._cpu_start = self.state.get("cpu_seconds", 0.0), time.process_time()
        window_tokens, window_time, window_loss = 0, time.time(), 0.0
        estimate = Estimate(self.state["step"], total_steps)
        with StopFlag() as flag:
            while self.state["epoch"] < epochs:
                epoch = self.state["epoch"]
                groups = self.epoch_groups(epoch)
                self.examples = self.examples_for(epoch)
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
                    if self.dist.main and not self.options.quiet:
                        line = estimate.update(step)
                        if line:
                            (bar.write if bar is not None else print)(line, file=sys.stderr)
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
            if self.state["epoch"] >= epochs and s.average > 1:
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
        """Average the last K epoch checkpoints into best/: the run's model (its dev score is logged).

        Averaging is kept whatever one dev score says: on 232 short dev sentences single epochs differ
        by a BLEU point by chance, while the average of the last epochs is the steadier model."""
        if not self.dist.main:
            return
        names = self.state.get("checkpoints", [])[-self.settings.average:]
        if len(names) < 2:
            return
        paths = [self.out / "checkpoints" / n / "model.safetensors" for n in names]
        latest = {k: v.clone() for k, v in self.model.state_dict().items()}
        average_into(self.model, paths)
        scores = self.dev_score()
        record = {"kind": "average", "checkpoints": names, **(scores or {})}
        self.log(record)
        self.state["best_bleu"] = scores["dev_bleu"] if scores else None
        self.state["best_step"] = f"average of {names}"
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
