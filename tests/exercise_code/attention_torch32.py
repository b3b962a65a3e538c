import torch


def attention(q, k, v, mask=None):
    q, k, v = (torch.as_tensor(a, dtype=torch.float32) for a in (q, k, v))
    scores = q @ k.T / q.shape[-1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~torch.as_tensor(mask, dtype=torch.bool), float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights, weights @ v
