"""Training: the Noam schedule, resume continues the same loss trajectory, DDP equals one process with
the same global batch, Ctrl-C leaves a loadable checkpoint."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from glassformer.data.batching import collate
from glassformer.data.checkpoint import load_translator_parts, read_json
from glassformer.errors import UsageError
from glassformer.training.commands import add_train_arguments
from glassformer.training.loop import Trainer, train
from glassformer.training.schedule import noam_lr, noam_schedule

TINY = ["--preset", "tiny", "--limit", "48", "--max-tokens", "128", "--no-eval", "--quiet", "--log-every", "1",
        "--threads", "1"]


def _args(out: Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    return parser.parse_args([*TINY, "--out", str(out), *extra])


def _losses(out: Path) -> dict[int, float]:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in lines if r["kind"] == "step"}


def _env() -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[1] / "src")
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_noam_schedule_rises_then_decays():
    d, warmup, factor = 64, 100, 2.0
    peak = factor * d ** -0.5 * warmup ** -0.5
    assert noam_lr(warmup, d, factor, warmup) == pytest.approx(peak)
    assert noam_lr(50, d, factor, warmup) == pytest.approx(peak / 2)            # linear warm-up
    assert noam_lr(400, d, factor, warmup) == pytest.approx(peak / 2)           # 1/sqrt(step) decay
    assert max(range(1, 1000), key=lambda s: noam_lr(s, d, factor, warmup)) == warmup


def _paper(step: int, d: int, factor: float, warmup: int) -> float:
    return factor * d ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def test_the_noam_lambda_schedule_gives_the_paper_learning_rate_at_every_step():
    d, warmup, factor = 64, 100, 2.0
    weight = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.Adam([weight], lr=1.0)
    schedule = noam_schedule(optimizer, d, factor, warmup)
    for step in range(1, 401):                                       # the lr optimizer step `step` runs at
        assert optimizer.param_groups[0]["lr"] == pytest.approx(_paper(step, d, factor, warmup), rel=1e-12), step
        weight.grad = torch.ones(3)
        optimizer.step()
        schedule.step()
    resumed = torch.optim.Adam([torch.nn.Parameter(torch.zeros(3))], lr=1.0)
    noam_schedule(resumed, d, factor, warmup, done=250)             # 250 steps behind: the next is step 251
    assert resumed.param_groups[0]["lr"] == pytest.approx(_paper(251, d, factor, warmup), rel=1e-12)


def _lrs(out: Path) -> dict[int, float]:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["lr"] for r in lines if r["kind"] == "step"}


@pytest.mark.slow
def test_resume_continues_the_same_loss_trajectory(tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = ("--epochs", "4", "--dropout", "0.1", "--seed", "3")
    assert train(_args(straight, *common, "--max-steps", "12")) == 0
    assert train(_args(split, *common, "--max-steps", "7")) == 0
    assert read_json(split / "state.json")["step"] == 7
    assert train(_args(split, "--resume", "--max-steps", "12")) == 0
    a, b = _losses(straight), _losses(split)
    assert sorted(a) == sorted(b) == list(range(1, 13))
    for step in range(8, 13):
        assert b[step] == pytest.approx(a[step], abs=1e-6), step
    assert len({round(a[s], 6) for s in a}) > 6                                   # the loss really moves
    for step, lr in _lrs(split).items():                    # the tiny preset: d 32, factor 1.0, warm-up 50
        assert lr == pytest.approx(_paper(step, 32, 1.0, 50), rel=1e-12), step
    assert read_json(split / "state.json")["position"] == read_json(straight / "state.json")["position"]
    with pytest.raises(UsageError, match="--resume"):                            # never silently restart
        train(_args(straight, *common))


def test_a_save_cut_after_its_weights_leaves_the_checkpoint_before_whole(tmp_path, monkeypatch):
    """A full disk while the optimizer is saved (the weights already written): the run stops with one error, and
    --resume continues from the checkpoint before, whole: the losses are the uninterrupted run's. Before, the top
    held the new weights beside the old optimizer and state, and the resumed run went another way."""
    from glassformer.data import checkpoint

    straight, split = tmp_path / "straight", tmp_path / "split"
    common = ("--epochs", "4", "--dropout", "0.1", "--seed", "3")
    assert train(_args(straight, *common, "--max-steps", "12")) == 0
    assert train(_args(split, *common, "--max-steps", "7")) == 0

    def full(optimizer, path):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(checkpoint, "save_optimizer", full)
    with pytest.raises(OSError, match="No space"):
        train(_args(split, "--resume", "--max-steps", "12"))
    monkeypatch.undo()
    assert read_json(split / "state.json")["step"] == 7
    with open(split / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('{"kind": "step", "step": 13, "lo')                 # a line a hard stop cut short
    assert train(_args(split, "--resume", "--max-steps", "12")) == 0
    a, b = _losses(straight), _losses(split)
    for step in range(8, 13):
        assert b[step] == pytest.approx(a[step], abs=1e-6), step
    lines = [json.loads(x) for x in (split / "metrics.jsonl").read_text().splitlines()]   # every line whole
    assert [r["step"] for r in lines if r["kind"] == "step"] == list(range(1, 13))   # steps 8-12 logged once


def test_a_run_cut_before_its_first_checkpoint_resumes_from_step_0(tmp_path):
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    common = ("--epochs", "4", "--dropout", "0.1", "--seed", "3", "--max-steps", "6")
    assert train(_args(straight, *common)) == 0
    assert train(_args(cut, *common)) == 0
    for name in ("state.json", "model.safetensors", "optimizer.safetensors", "metrics.jsonl"):
        (cut / name).unlink()                                   # what a run stopped during its first epoch has
    import shutil
    shutil.rmtree(cut / "checkpoints")
    assert train(_args(cut, "--resume")) == 0
    assert _losses(cut) == pytest.approx(_losses(straight), abs=1e-6)


def test_a_resumed_runs_files_are_checked_and_nothing_outside_it_is_touched(tmp_path):
    run, victim = tmp_path / "run", tmp_path / "victim"
    assert train(_args(run, "--epochs", "2", "--seed", "3", "--max-steps", "5")) == 0
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    state = read_json(run / "state.json")
    for bad, words in (({**state, "checkpoints": ["../../victim"]}, "not a checkpoint name"),
                       ({**state, "step": "ten"}, "step: expected an integer"), ([], "expected a JSON object"),
                       ({**state, "rng": {}}, "rng: not a saved random state")):
        (run / "state.json").write_text(json.dumps(bad))
        with pytest.raises(UsageError, match=words):
            train(_args(run, "--resume", "--max-steps", "9", "--keep", "1"))
    assert (victim / "keep.txt").read_text() == "mine"
    (run / "state.json").write_text(json.dumps(state))
    weights = run / "checkpoints" / f"step-{state['step']}" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])                         # cut short (the top's is the same file)
    with pytest.raises(UsageError, match="cannot resume from it"):
        train(_args(run, "--resume", "--max-steps", "9"))
    for inside in (run / "best", run / "checkpoints" / "step-1"):            # a new run inside this one
        with pytest.raises(UsageError, match="inside the run"):
            train(_args(inside))


def test_the_torchrun_entry_point_answers_errors_in_one_line_as_the_command_does(tmp_path, monkeypatch, capsys):
    """python -m glassformer.train (what torchrun launches) runs through the command's error handling: anything but
    a UsageError (safetensors' FileNotFoundError without a file name, a JSONDecodeError) was a traceback from every
    rank, and the command printed "None: None" for the first."""
    from glassformer.training import commands, loop

    for error, code, words in ((FileNotFoundError(2, "No such file or directory"), 2, "No such file or directory"),
                               (json.JSONDecodeError("Expecting value", "{", 1), 2, "invalid JSON"),
                               (OSError(28, "No space left on device", "x/model.safetensors"), 1, "No space left")):
        def fails(args, error=error):
            raise error

        monkeypatch.setattr(loop, "train", fails)
        with pytest.raises(SystemExit) as stop:
            commands.main([*TINY, "--out", str(tmp_path / "run")])
        err = capsys.readouterr().err
        assert stop.value.code == code and err.count("\n") == 1 and words in err and "None" not in err, err


@pytest.mark.slow
def test_resume_keeps_the_cooldown_and_the_dropout_draws(tmp_path):
    """With a cool-down, word dropout and BPE-dropout, a run stopped at step 7 and resumed ends where the
    straight run does: the same learning rates (the cool-down planned over the epochs) and the same losses (the
    word dropout draws continue from the saved random state; BPE-dropout's cuts are seeded by the step)."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = ("--epochs", "2", "--seed", "3", "--cooldown", "0.5", "--word-dropout", "0.3", "--bpe-dropout", "0.2")
    assert train(_args(straight, *common)) == 0
    assert train(_args(split, *common, "--max-steps", "7")) == 0
    assert train(_args(split, "--resume", "--max-steps", "1000")) == 0     # past the end: the epochs end it
    a, b = _losses(straight), _losses(split)
    assert sorted(a) == sorted(b) and len(a) > 8
    for step in sorted(a)[7:]:
        assert b[step] == pytest.approx(a[step], abs=1e-6), step
    assert _lrs(split) == pytest.approx(_lrs(straight), rel=1e-12)
    rates = _lrs(straight)                                  # 12 steps, the last 6 cooled: the last at 1/6
    assert rates[max(rates)] < 0.3 * max(rates.values()) and rates[max(rates)] < rates[max(rates) - 1]


@pytest.mark.slow
def test_hsk_finish_epochs_train_on_the_hsk_examples_only(tmp_path):
    """--hsk-finish 1: the last epoch's steps cover exactly the HSK examples once, no Tatoeba pair."""
    from glassformer.training.loop import Trainer

    trainer = Trainer(_args(tmp_path / "run", "--epochs", "3", "--hsk-finish", "1", "--tatoeba"))
    everything, hsk = trainer.data.examples, trainer.data.finish
    assert 0 < len(hsk) < len(everything) and all(e in everything for e in hsk)
    assert trainer.data.counts["tatoeba_pairs"] == 48
    assert trainer.examples_for(1) is everything and trainer.examples_for(2) is hsk
    assert trainer.run() == 0
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    tokens = {epoch: sum(r["tokens"] for r in lines if r["kind"] == "step" and r["epoch"] == epoch)
              for epoch in range(3)}
    assert tokens[0] == tokens[1] == sum(len(e.tgt) + 1 for e in everything)
    assert tokens[2] == sum(len(e.tgt) + 1 for e in hsk)


@pytest.mark.slow
def test_the_run_ends_with_the_average_of_its_last_epochs_in_best(tmp_path):
    """--average 2: best/ holds the element-wise mean of the last two epoch checkpoints, with or without a
    dev score (a single noisy dev number does not veto the average)."""
    from safetensors.torch import load_file

    out = tmp_path / "run"
    assert train(_args(out, "--epochs", "3", "--average", "2", "--dropout", "0.1")) == 0
    state = read_json(out / "state.json")
    last_two = state["checkpoints"][-2:]
    assert len(last_two) == 2 and read_json(out / "best" / "state.json")["averaged"] == last_two
    a, b = (load_file(out / "checkpoints" / name / "model.safetensors") for name in last_two)
    best = load_file(out / "best" / "model.safetensors")
    assert set(best) == set(a)
    moved = 0
    for key in best:
        assert torch.allclose(best[key], (a[key].double() + b[key].double()).div(2).to(best[key].dtype), atol=1e-6)
        moved += int(not torch.equal(a[key], b[key]))
    assert moved > 0                                                    # the two epochs really differ
    latest = load_file(out / "model.safetensors")                       # training weights stay the last epoch's
    assert all(torch.equal(latest[k], b[k]) for k in b)


def test_a_cooled_run_ends_at_its_last_weights_whatever_an_earlier_dev_score_said(tmp_path, monkeypatch):
    """--cooldown with --average 1: best/ holds the last (annealed) epoch's weights, not the epoch with the best
    dev BLEU; without a cool-down best/ stays the best dev epoch. Dev scores are made to fall epoch by epoch."""
    from safetensors.torch import load_file

    from glassformer.training import loop

    for cooldown, expected in (("0.3", -1), ("0", 0)):
        scores = iter([30.0, 20.0, 10.0, 5.0])
        monkeypatch.setattr(loop.Trainer, "evaluate", lambda self, s=scores: {"dev_bleu": next(s), "dev_chrf": 1.0})
        out = tmp_path / f"run-{cooldown}"
        assert train(_args(out, "--epochs", "3", "--average", "1", "--cooldown", cooldown, "--keep", "3")) == 0
        names = read_json(out / "state.json")["checkpoints"]
        assert len(names) == 3
        best = load_file(out / "best" / "model.safetensors")
        chosen = load_file(out / "checkpoints" / names[expected] / "model.safetensors")
        other = load_file(out / "checkpoints" / names[-1 - expected] / "model.safetensors")
        assert all(torch.equal(best[k], chosen[k]) for k in best)
        assert not all(torch.equal(best[k], other[k]) for k in best)


@pytest.mark.slow
def test_bfloat16_training_keeps_fp32_weights_and_adam_state_and_a_close_loss(tmp_path):
    """--dtype bfloat16: autocast around forward and loss only. After 8 steps the weights and Adam's moments
    are float32, the loss is within 0.2% of the float32 run's (measured here: at most 0.02%), the checkpoint loads
    as float32, and the run's settings keep the precision."""
    common = ("--epochs", "2", "--max-steps", "8", "--seed", "3")
    full = Trainer(_args(tmp_path / "fp32", *common))
    half = Trainer(_args(tmp_path / "bf16", *common, "--dtype", "bfloat16"))
    assert full.run() == 0 and half.run() == 0
    assert all(p.dtype == torch.float32 for p in half.model.parameters())
    moments = [v for state in half.optimizer.state.values() for k, v in state.items() if k in ("exp_avg", "exp_avg_sq")]
    assert moments and all(v.dtype == torch.float32 for v in moments)
    a, b = _losses(tmp_path / "fp32"), _losses(tmp_path / "bf16")
    assert sorted(a) == sorted(b) == list(range(1, 9))
    assert a[1] != b[1]                                                 # bfloat16 really ran
    for step in a:
        assert abs(b[step] - a[step]) < 0.002 * a[step], (step, a[step], b[step])
    with half.precision():
        hidden = half.model.logits(torch.randn(3, half.cfg.d_model))
        batch = collate(half.examples, [0, 1])
        loss = half.loss_module(batch.src, batch.tgt_in, batch.labels)
    assert hidden.dtype == torch.bfloat16 and loss.dtype == torch.float32   # matmuls in bf16, the loss in fp32
    model, *_ = load_translator_parts(tmp_path / "bf16")
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert read_json(tmp_path / "bf16" / "config.json")["train"]["dtype"] == "bfloat16"


@pytest.mark.slow
def test_compiled_training_step_follows_the_eager_losses_and_weights(tmp_path):
    """--compile: forward, loss and backward as inductor kernels. The same seed and batches give the eager run's
    per-step losses and final weights up to float rounding (a dropped or doubled gradient, or a loss over the
    PAD rows, would move them by far more than 1e-4 relative). A one-layer model keeps the compile short."""
    small = ("--max-steps", "4", "--seed", "5", "--layers", "1")
    eager = Trainer(_args(tmp_path / "eager", *small))
    compiled = Trainer(_args(tmp_path / "compiled", *small, "--compile"))
    assert compiled.loss_module is not compiled.model                  # really wrapped
    assert eager.run() == 0 and compiled.run() == 0
    a, b = _losses(tmp_path / "eager"), _losses(tmp_path / "compiled")
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-4), step
    # W^K's bias has no true gradient (softmax ignores a shift shared by every key), so Adam turns the rounding
    # noise of either run into full-size steps there: every other weight must agree.
    apart = [name for (name, x), y in zip(eager.model.state_dict().items(), compiled.model.state_dict().values(),
                                          strict=True)
             if not name.endswith("w_k.bias") and not torch.allclose(x, y, rtol=1e-3, atol=1e-5)]
    assert apart == []


def test_compile_without_a_cxx_compiler_trains_eagerly_after_one_line(tmp_path, monkeypatch, capsys):
    import glassformer.inference.compiler as compiler

    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(compiler.shutil, "which", lambda name: None)
    trainer = Trainer(_args(tmp_path / "run", "--max-steps", "1", "--compile"))
    assert trainer.loss_module.__class__.__name__ == "LossModule"     # not wrapped by torch.compile
    assert trainer.run() == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if "--compile" in x]
    assert lines == ["glassformer train: --compile: no C++ compiler found (g++); training eagerly"]


@pytest.mark.slow
def test_ddp_two_processes_match_one_process_with_the_same_global_batch(tmp_path):
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    common = ["--epochs", "2", "--max-steps", "6", "--seed", "5"]
    assert train(_args(single, *common, "--accumulate", "2")) == 0
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "glassformer.train", *TINY, "--out", str(ddp), *common, "--device", "cpu"]
    run = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    a, b = _losses(single), _losses(ddp)
    assert sorted(a) == sorted(b) == list(range(1, 7))
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-5, abs=1e-5), step
    model, *_ = load_translator_parts(ddp)
    ref, *_ = load_translator_parts(single)
    for x, y in zip(model.parameters(), ref.parameters(), strict=True):
        assert (x - y).abs().max().item() < 1e-4


@pytest.mark.slow
def test_a_resumed_ddp_run_with_dropout_follows_the_uninterrupted_one(tmp_path):
    """Each rank draws its own dropout masks: every rank's random state is saved and restored (before, rank 0's
    was given to both, and the resumed losses went another way)."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = ["--epochs", "3", "--seed", "5", "--dropout", "0.3", "--word-dropout", "0.2", "--device", "cpu"]

    def ddp(out, *extra):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "-m", "glassformer.train", *TINY, "--out", str(out), *extra]
        run = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=180)
        assert run.returncode == 0, run.stderr[-2000:]

    ddp(straight, *common, "--max-steps", "8")
    ddp(split, *common, "--max-steps", "4")
    ddp(split, "--resume", "--max-steps", "8", "--device", "cpu")
    a, b = _losses(straight), _losses(split)
    assert sorted(a) == sorted(b) == list(range(1, 9))
    for step in range(5, 9):
        assert b[step] == pytest.approx(a[step], abs=1e-6), step


@pytest.mark.slow
def test_ctrl_c_saves_a_loadable_checkpoint_and_exits_cleanly(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "glassformer.train", *TINY, "--out", str(out), "--epochs", "1000"]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        metrics = out / "metrics.jsonl"
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode in (0, 130), err[-2000:]
    assert "Traceback" not in err
    assert "interrupted" in err
    state = read_json(out / "state.json")
    assert state["step"] >= 3
    model, source, target, _ = load_translator_parts(out)
    assert model.cfg.d_model == 32 and source.vocab_size > 4 and target.vocab_size > 4


def test_bpe_dropout_keeps_the_tokenizers_pieces_where_a_cut_would_pass_max_len(tmp_path):
    from glassformer.training.loop import Trainer

    trainer = Trainer(_args(tmp_path / "run", "--bpe-dropout", "0.99", "--limit", "1000"))
    examples, max_len = trainer.examples, trainer.cfg.max_len
    chars = {i: sum(len(trainer.data.target.id_to_token(t)) for t in e.tgt) for i, e in enumerate(examples)}
    long = max(chars, key=chars.get)                        # nearly every merge skipped: about a piece a character
    short = min((i for i in chars if len(examples[i].tgt) > 2), key=chars.get)
    assert chars[long] >= max_len > chars[short] + 1
    cut = trainer.step_examples([[long, short]])
    assert cut[long].tgt == examples[long].tgt              # the cut would pass max_len: the tokenizer's pieces
    assert len(cut[short].tgt) > len(examples[short].tgt)   # cut smaller


def test_a_step_whose_group_repeats_a_batch_counts_its_tokens_each_time(tmp_path):
    """Fewer batches than --accumulate: the step group repeats the batch, and the loss is divided by the tokens
    of every micro-batch run (a count over distinct examples would inflate the per-token loss)."""
    from glassformer.training.loop import Trainer

    trainer = Trainer(_args(tmp_path / "run", "--limit", "3", "--accumulate", "3", "--max-steps", "1"))
    group = trainer.epoch_groups(0)[0]
    assert len(group) == 3 and group[0] == group[1] == group[2]
    _, tokens, _ = trainer.step(group)
    assert tokens == 3 * sum(len(trainer.examples[i].tgt) + 1 for i in group[0])
