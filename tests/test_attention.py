"""Self- and cross-attention: the SDPA and math backends agree; masks, empty rows, heads, the KV cache."""

import math

import pytest
import torch

from glassformer.model import (
    CrossAttention,
    KVCache,
    ModelConfig,
    SelfAttention,
    causal_mask,
    intervene,
    padding_mask,
    probes,
)
from glassformer.model.positions import RelativePositionBias, RotaryEmbedding


def pair(kind=SelfAttention, **kw):
    """The same weights behind an SDPA-backend and a math-backend module."""
    fast = kind(12, 3, 4, 5, path="fast", **kw).eval()
    glass = kind(12, 3, 4, 5, path="glass", **kw).eval()
    with torch.no_grad():
        for p in fast.parameters():
            p.normal_(0, 0.3)                              # biases too: not zero
    glass.load_state_dict(fast.state_dict())
    return fast, glass


def random_mask(b, q, k):
    mask = torch.rand(b, 1, q, k) > 0.3
    mask[..., 0] = True                                   # every row keeps a key
    return mask


@pytest.mark.parametrize("kind", ["none", "padding", "causal", "random", "causal+padding"])
@pytest.mark.parametrize("positions", ["none", "rope", "relative"])
def test_fast_and_glass_paths_agree_self_attention(kind, positions):
    kw = {}
    if positions == "rope":
        kw["rope"] = RotaryEmbedding(4)
    if positions == "relative":
        kw["relative"] = RelativePositionBias(3, 4)
    fast, glass = pair(**kw)
    glass.rope, glass.relative = fast.rope, fast.relative
    x = torch.randn(4, 9, 12)
    pad = torch.zeros(4, 9, dtype=torch.bool)
    pad[1, 6:] = True
    mask = {"none": None, "padding": padding_mask(pad), "causal": None, "random": random_mask(4, 9, 9),
            "causal+padding": padding_mask(pad)}[kind]
    causal = kind.startswith("causal")
    with torch.no_grad():
        a = fast(x, mask=mask, causal=causal)
        b = glass(x, mask=mask, causal=causal)
    assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()


def test_fast_and_glass_paths_agree_cross_attention():
    fast, glass = pair(CrossAttention)
    x, memory = torch.randn(2, 5, 12), torch.randn(2, 8, 12)
    pad = torch.zeros(2, 8, dtype=torch.bool)
    pad[0, 4:] = True
    with torch.no_grad():
        a = fast(x, memory, mask=padding_mask(pad))
        b = glass(x, memory, mask=padding_mask(pad))
    assert torch.allclose(a, b, atol=1e-5)


def test_glass_path_is_the_formula():
    """softmax_key(Q K^T / sqrt(d_k)) V per head, concat, W^O — written out independently here."""
    _, glass = pair()
    x = torch.randn(1, 6, 12, dtype=torch.float64)
    glass = glass.double()
    with torch.no_grad(), probes(glass, "head.*.weights") as trace:
        out = glass(x)
        wq, wk, wv = glass.w_q, glass.w_k, glass.w_v
        heads = []
        for h in range(3):
            q = x[0] @ wq.weight[h * 4:(h + 1) * 4].T + wq.bias[h * 4:(h + 1) * 4]
            k = x[0] @ wk.weight[h * 4:(h + 1) * 4].T + wk.bias[h * 4:(h + 1) * 4]
            v = x[0] @ wv.weight[h * 5:(h + 1) * 5].T + wv.bias[h * 5:(h + 1) * 5]
            s = q @ k.T / math.sqrt(4)
            a = torch.exp(s - s.max(dim=1, keepdim=True).values)
            a = a / a.sum(dim=1, keepdim=True)
            assert torch.allclose(trace[f"head.{h}.weights"][0], a, atol=1e-12)
            heads.append(a @ v)
        expected = torch.cat(heads, dim=1) @ glass.w_o.weight.T + glass.w_o.bias
    assert torch.allclose(out[0], expected, atol=1e-12)
    weights = trace["head.0.weights"][0]
    assert torch.allclose(weights.sum(dim=-1), torch.ones(6, dtype=torch.float64))   # rows sum to 1
    assert not torch.allclose(weights.sum(dim=0), torch.ones(6, dtype=torch.float64))  # columns need not


@pytest.mark.parametrize("path", ["fast", "glass"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_without_visible_key_gives_zeros_not_nan(path, dtype):
    mha = SelfAttention(8, 2, 4, 4, path=path).to(dtype)
    x = torch.randn(2, 4, 8, dtype=dtype, requires_grad=True)
    mask = torch.ones(2, 1, 4, 4, dtype=torch.bool)
    mask[0, :, 2, :] = False                              # sentence 0, query row 2 sees nothing
    with probes(mha, "head.*.weights" if path == "glass" else "output") as trace:
        out = mha(x, mask=mask)
    assert torch.isfinite(out.float()).all()
    bias_only = mha.w_o.bias.to(dtype)
    assert torch.allclose(out[0, 2].float(), bias_only.float())  # zero head outputs -> only the W^O bias
    if path == "glass":
        assert torch.all(trace["head.0.weights"][0, 2] == 0)
        assert torch.allclose(trace["head.0.weights"][0, 1].float().sum(), torch.tensor(1.0), atol=1e-2)
    out.float().sum().backward()
    assert torch.isfinite(x.grad.float()).all()


def test_switched_off_head_removes_exactly_its_contribution():
    _, glass = pair()
    glass = glass.double()
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    off = {"head.1.output": lambda value, name: torch.zeros_like(value)}
    with torch.no_grad():
        with probes(glass) as t_all:
            full = glass(x)
        with intervene(glass, off), probes(glass) as t_off:
            switched = glass(x)
    w_o = glass.w_o.weight                                 # (d, H*d_v)
    head1 = t_all["head.1.output"] @ w_o[:, 5:10].T        # head 1's share of W^O's output
    assert torch.allclose(full - switched, head1, atol=1e-12)
    assert torch.all(t_off["concat"][..., 5:10] == 0)
    assert torch.all(t_off["head.1.output"] == 0)          # recorded after the switch: what flows on
    assert torch.allclose(t_off["head.0.output"], t_all["head.0.output"])  # other heads unchanged
    assert torch.allclose(t_off["concat"][..., :5], t_all["concat"][..., :5])


@pytest.mark.parametrize("path", ["fast", "glass"])
def test_kv_cache_one_row_per_step_equals_full_causal(path):
    mha = SelfAttention(12, 3, 4, 4, path=path, rope=RotaryEmbedding(4)).eval()
    x = torch.randn(2, 7, 12)
    with torch.no_grad():
        full = mha(x, causal=True)
        cache, steps = KVCache(capacity=4), []                                # grows past 4 on the way
        for i in range(7):
            steps.append(mha(x[:, i:i + 1], causal=True, cache=cache))
            cache.advance(1)
    assert cache.length == 7 and cache.k[mha].size(2) >= 7
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)


def test_cross_attention_cache_is_computed_once():
    mha = CrossAttention(12, 3, 4, 4).eval()
    memory = torch.randn(2, 6, 12)
    cache = KVCache(capacity=8)
    calls = []
    original = mha.project_kv
    mha.project_kv = lambda *args: calls.append(1) or original(*args)
    with torch.no_grad():
        for _ in range(4):
            mha(torch.randn(2, 1, 12), memory, cache=cache)
    assert len(calls) == 1 and cache.cross[mha][0].shape == (2, 3, 6, 4)


def test_causal_mask_alignment_with_cache_offset():
    m = causal_mask(2, 5, offset=3)                        # queries are positions 3 and 4
    assert m.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    assert causal_mask(3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]


def test_unscaled_scores_switch():
    cfg = ModelConfig.tiny()
    assert cfg.scale_scores
    mha = SelfAttention(4, 1, 4, 4, scale=False, path="glass").double()
    with torch.no_grad():
        for w in (mha.w_q, mha.w_k, mha.w_v):
            w.weight.copy_(torch.eye(4))
            w.bias.zero_()
    x = torch.tensor([[[1.0, 0, 1, 0], [0, 1, 0, 2]]], dtype=torch.float64)
    with probes(mha, "head.0.*") as t:
        mha(x)
    assert torch.allclose(t["head.0.scaled_scores"], t["head.0.scores"])
    assert t["head.0.scores"][0].tolist() == [[2.0, 0.0], [0.0, 5.0]]


def test_self_and_cross_attention_name_their_projections_alike():
    """W^Q, W^K, W^V, W^O are four nn.Linear modules, laid out the same way in self- and cross-attention."""
    shapes = {}
    for kind in (SelfAttention(12, 3, 4, 5), CrossAttention(12, 3, 4, 5)):
        shapes[type(kind).__name__] = {name: tuple(p.shape) for name, p in kind.named_parameters()}
    assert shapes["SelfAttention"] == shapes["CrossAttention"] == {
        "w_q.weight": (12, 12), "w_q.bias": (12,), "w_k.weight": (12, 12), "w_k.bias": (12,),
        "w_v.weight": (15, 12), "w_v.bias": (15,), "w_o.weight": (12, 15), "w_o.bias": (12,)}


def test_head_hooks_switch_to_the_math_backend_and_back(monkeypatch):
    """Nothing attached: SDPA runs. A per-head probe: the math backend runs, with the same numbers."""
    import glassformer.model.attention as attention
    fast, _ = pair()
    calls = []
    real = attention.attend_math
    monkeypatch.setattr(attention, "attend_math", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = torch.randn(2, 5, 12)
    with torch.no_grad():
        plain = fast(x, causal=True)
        assert calls == []
        with probes(fast, "head.2.weights") as rec:
            hooked = fast(x, causal=True)
        assert calls == [1] and rec["head.2.weights"].shape == (2, 5, 5)
        assert torch.all(rec["head.2.weights"].triu(1) == 0)          # the triangle reached the math backend
        fast(x, causal=True)
        assert calls == [1]                                            # detached again: back to SDPA
    assert torch.allclose(plain, hooked, atol=1e-5)


def test_patching_a_head_output_from_another_run():
    """Write head 0's output of run A into run B: B's output moves by exactly head 0's W^O share of A − B."""
    _, glass = pair()
    glass = glass.double()
    xa, xb = torch.randn(1, 4, 12, dtype=torch.float64), torch.randn(1, 4, 12, dtype=torch.float64)
    with torch.no_grad():
        with probes(glass, "head.0.output") as clean:
            glass(xa)
        with probes(glass, "head.0.output") as corrupt:
            out_b = glass(xb)
        with intervene(glass, {"head.0.output": lambda v, n: clean[n]}):
            patched = glass(xb)
    w_o = glass.w_o.weight[:, :5]                                 # head 0's columns of W^O
    want = out_b + (clean["head.0.output"] - corrupt["head.0.output"]) @ w_o.T
    assert torch.allclose(patched, want, atol=1e-12)


def test_hook_errors_name_the_problem():
    mha = SelfAttention(12, 3, 4, 4)
    with pytest.raises(KeyError, match="head.9.output"):
        with intervene(mha, {"head.9.output": lambda v, n: v}):
            pass
    with pytest.raises(ValueError, match="head.0.weights"):
        with intervene(mha, {"head.0.weights": lambda v, n: v[..., :1]}):
            mha(torch.randn(1, 3, 12))
    assert not any(p.fns for p in mha.modules() if hasattr(p, "fns"))  # everything detached after the error
