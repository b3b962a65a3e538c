"""Reading the vocabulary head row by row: what each target row predicts next, and how sure it is.

The walk takes plain values (one sentence's logits and its right-shifted input ids), so every
consumer — the lesson's views, `glassformer explain`, the lab's Sentence view — reads the rows the
same way. Row t's input is inputs[t]; the token it should predict is inputs[t + 1], and after the
last input EOS — unless the output was cut at the length limit, when the last row's next token is
simply the model's own choice (there is no EOS to predict).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class NextToken:
    """One target row: its input, the token it should predict, that token's probability and rank, the top k."""

    row: int
    input_id: int
    next_id: int
    p_next: float
    rank: int                              # 1 = the most probable token
    top: list[tuple[int, float]]           # (token id, probability), most probable first


def next_token_walk(logits: Tensor, inputs: list[int], eos: int, *, finished: bool = True,
                    top: int = 5) -> list[NextToken]:
    """Per-row next tokens of one sentence: logits (tgt, vocab) for the right-shifted `inputs` (BOS first).

    `finished`: the output ended by itself (teacher forcing, or greedy stopped at EOS); False when a greedy
    output was cut at the length limit.
    """
    if logits.dim() != 2 or logits.size(0) != len(inputs):
        raise ValueError(f"logits: expected ({len(inputs)}, vocab) for {len(inputs)} inputs, "
                         f"got {tuple(logits.shape)}")
    if top < 1:
        raise ValueError(f"top: expected at least 1, got {top}")
    probs = torch.softmax(logits.double(), dim=-1)                        # (tgt, vocab)
    last = eos if finished else int(probs[-1].argmax())
    labels = [*inputs[1:], last]
    rows = []
    for t, label in enumerate(labels):
        p = probs[t]                                                      # (vocab,)
        values, ids = p.topk(min(top, p.numel()))
        rows.append(NextToken(row=t, input_id=int(inputs[t]), next_id=int(label), p_next=float(p[label]),
                              rank=int((p > p[label]).sum()) + 1,
                              top=[(int(i), float(v)) for v, i in zip(values.tolist(), ids.tolist(), strict=True)]))
    return rows


def walk_inputs(outputs: list[int], bos: int, max_len: int, *, finished: bool = True) -> list[int]:
    """The right-shifted inputs that read `outputs` back: BOS + outputs.

    An output cut at the model's own length limit (not finished, max_len tokens) would need max_len + 1
    positions; its last token is dropped instead — the last row predicts it, the model's own choice.
    """
    inputs = [bos, *outputs]
    if not finished and len(inputs) > max_len:
        inputs = inputs[:-1]
    return inputs
