"""ALTI+: how much each source unit and each target input contributes to every target row.

ALTI (Ferrando, Gállego, Costa-jussà 2022, "Measuring the Mixing of Contextual Information in the
Transformer") splits each attention block — the attention with its residual and LayerNorm — into one
vector per input token; ALTI+ (Ferrando, Gállego, Alastruey, Escolano, Costa-jussà 2022, "Towards
Opening the Black Box of Neural Machine Translation: Source and Target Contributions to the Model")
carries it through the encoder, the decoder's masked self-attention and its cross-attention.

One block, row i (heads h, keys j; A_h the recorded attention weights):

    s_i = x_i + Σ_h Σ_j A_h[i,j] (v_j W_V^h + b_V^h) W_O^h + b_O             the pre-norm sum
        = Σ_j z_i(x_j) + b_i,      z_i(x_j) = δ_ij x_i + Σ_h A_h[i,j] v_j W_V^h W_O^h
                                   b_i = Σ_h (Σ_j A_h[i,j]) b_V^h W_O^h + b_O
    post-norm: y_i = LN(s_i) = Σ_j T_i(x_j) + γ ⊙ (b_i − mean(b_i)) / σ_i + β,
               T_i(x_j) = γ ⊙ (z_i(x_j) − mean(z_i(x_j))) / σ_i,   σ_i = sqrt(var(s_i) + ε) of the whole sum
    pre-norm:  y_i = s_i, T_i(x_j) = z_i(x_j); the values see v_j = LN(x_j) = γ ⊙ x̂_j + β, so v_j is taken
               as γ ⊙ x̂_j and β W_V^h joins b_V^h in the bias.

Self-attention: v_j = x_j (post) and the tokens are the block's input rows. Cross-attention: v_j = e_j,
the encoder output, and the tokens are the row's own residual x_i (column 0) and e_1 … e_S.
The contribution of token j to row i, then each row normalised to sum to 1:

    c_ij = max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁)              ĉ_ij = c_ij / Σ_k c_ik

(a row whose every c_ij is 0 — the bias alone is as close to y_i as any token — keeps itself: ĉ_ii = 1,
in cross-attention its residual.) Composition (rollout): the encoder C_enc = Ĉ_L ⋯ Ĉ_1 (S × S); the
decoder carries M (T × (S + T)), starting [0 | I]:

    self-attention   M ← Ĉ M
    cross-attention  M_i ← r_i M_i + Σ_j ĉ_ij [C_enc[j] | 0]        r_i = ĉ_i0, the residual's share

FFN blocks act on each row alone and are not decomposed (no mixing). Row t of the final M: the source
and prefix contributions of target row t (inputs BOS, y_1 … y_t; it predicts y_{t+1}); non-negative,
summing to 1. Everything is float64, from the values one recording pass gives (`model.probes`: per-head
weights, sub-layer inputs, residual sums and LayerNorm outputs, the encoder output) and the model's own
W_V, b_V, W_O, b_O, γ, β, ε. Relative and rotary positions change A only, never the value path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import UsageError

CHUNK = 1 << 22                 # float64 entries of one (rows, tokens, d) slab of terms (memory, not results)
PROBES = ("*.head.*.weights", "encoder.*.sublayer.0.*", "decoder.*.sublayer.0.*", "decoder.*.sublayer.1.*",
          "encoder.output")


@dataclass
class Block:
    """One attention block decomposed token by token: y_i = Σ_j T_i(x_j) + bias_i (module docstring).

    The terms are kept as their factors and built by `terms()` a slab of rows at a time."""

    name: str                   # "encoder.0.self_attention", "decoder.1.cross_attention"
    cross: bool                 # column 0 is the row's residual, columns 1.. the encoder rows
    weights: Tensor             # (H, n, m) A_h
    projected: Tensor           # (H, m, d) v_j W_V^h W_O^h
    residual: Tensor            # (n, d) x_i
    gain: Tensor | None         # (d,) γ of a post-norm LayerNorm (None: pre-norm, no norm after the sum)
    sigma: Tensor | None        # (n, 1) σ_i of the post-norm sum
    bias: Tensor                # (n, d) everything that is not a token's
    output: Tensor              # (n, d) y_i, the recorded block output

    def terms(self, rows: slice = slice(None)) -> Tensor:
        """T_i(x_j) for the rows `rows`: (rows, m, d), or (rows, 1 + m, d) for cross-attention."""
        z = torch.einsum("hij,hjd->ijd", self.weights[:, rows], self.projected)   # Σ_h A_h[i,j] v_j W_V^h W_O^h
        x = self.residual[rows]                                              # (rows, d)
        if self.cross:
            z = torch.cat([x[:, None], z], dim=1)                            # the residual as its own token
        else:
            at = torch.arange(self.residual.size(0))[rows]
            z[torch.arange(len(at)), at] += x                                # δ_ij x_i
        if self.gain is None:
            return z
        return self.gain * (z - z.mean(-1, keepdim=True)) / self.sigma[rows, None]   # γ ⊙ (z − mean z) / σ_i

    def reconstruct(self) -> Tensor:
        """Σ_j T_i(x_j) + bias_i, (n, d): equals `output` (the tests hold it to 1e-10)."""
        return self.terms().sum(1) + self.bias


def _projections(attention) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """W_V (d, H, d_v), b_V (H, d_v), W_O (H, d_v, d), b_O (d,) of an attention module, float64."""
    heads, d_v, d = attention.heads, attention.d_v, attention.d_model
    w_v = attention.w_v.weight.detach().cpu().double().T.reshape(d, heads, d_v)  # nn.Linear stores (out, in)
    w_o = attention.w_o.weight.detach().cpu().double().T.reshape(heads, d_v, d)  # head h: rows h*d_v:(h+1)*d_v
    b_v, b_o = attention.w_v.bias, attention.w_o.bias                       # None without biases: zeros
    b_v = torch.zeros(heads * d_v, dtype=torch.float64) if b_v is None else b_v.detach().cpu().double()
    b_o = torch.zeros(d, dtype=torch.float64) if b_o is None else b_o.detach().cpu().double()
    return w_v, b_v.reshape(heads, d_v), w_o, b_o


def _block(name: str, attention, norm, post: bool, weights: Tensor, values: Tensor, value_bias: Tensor,
           residual: Tensor, summed: Tensor, output: Tensor, cross: bool) -> Block:
    """A Block from the recorded weights (H, n, m), the rows the values see (m, d) with their extra value
    bias (d,) (β of a pre-norm LayerNorm, else 0), the residual x (n, d), the pre-norm sum s (n, d), y (n, d)."""
    w_v, b_v, w_o, b_o = _projections(attention)
    projected = torch.einsum("md,dhe,hef->hmf", values, w_v, w_o)          # (H, m, d) v_j W_V^h W_O^h
    head_bias = torch.einsum("he,hef->hf", b_v + torch.einsum("d,dhe->he", value_bias, w_v), w_o)   # (H, d)
    bias = torch.einsum("hi,hf->if", weights.sum(-1), head_bias) + b_o     # (n, d) b_i
    gain = sigma = None
    if post:
        gain = norm.weight.detach().cpu().double()                                 # (d,) γ
        beta = norm.bias.detach().cpu().double()                                   # (d,) β
        sigma = (summed.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()   # (n, 1) σ_i of the whole sum
        bias = gain * (bias - bias.mean(-1, keepdim=True)) / sigma + beta
    return Block(name, cross, weights, projected, residual, gain, sigma, bias, output)


def _check(model, src: Tensor, tgt_in: Tensor) -> None:
    cfg = getattr(model, "cfg", None)
    if cfg is None or cfg.family != "encoder-decoder" or not hasattr(model, "probes"):
        family = getattr(cfg, "family", type(model).__name__)
        raise UsageError(f"method alti: explains encoder-decoder models with hook points, not {family}", "method")
    if src.dim() != 2 or tgt_in.dim() != 2 or src.size(0) != 1 or tgt_in.size(0) != 1:
        raise UsageError("method alti: expected one sentence, src (1, S) and tgt_in (1, T)", "method")


@torch.no_grad()
def record(model, src: Tensor, tgt_in: Tensor, src_pad: Tensor | None = None):
    """One teacher-forced pass recording what the decomposition needs (PROBES)."""
    _check(model, src, tgt_in)
    model.eval()
    src_pad = model.source_padding(src) if src_pad is None else src_pad
    with model.probes(*PROBES) as rec:
        model(src, tgt_in, src_pad)
    if "encoder.output" not in rec:
        raise UsageError("method alti: this model copy fires no hook points; attribute on the model itself", "method")
    return rec


def _layer_blocks(stack: str, i: int, layer, post: bool, rec, memory: Tensor | None) -> list[Block]:
    """The attention blocks of one layer: self-attention, then (decoder) cross-attention."""
    def got(name: str) -> Tensor:
        return rec[name][0].cpu().double()                                   # (len, ...) of the one sentence

    def head_weights(attn: str, heads: int) -> Tensor:
        return torch.stack([got(f"{stack}.{i}.{attn}.head.{h}.weights") for h in range(heads)])   # (H, n, m)

    blocks = []
    sub = f"{stack}.{i}.sublayer.0"
    attention, norm = layer.self_attention, layer.sublayer[0].layer_norm
    x = got(f"{sub}.input")                                                  # (n, d)
    if post:
        values, extra = x, torch.zeros_like(x[0])
        summed, output = got(f"{sub}.residual"), got(f"{sub}.normed")
    else:
        beta = norm.bias.detach().cpu().double()
        values, extra = got(f"{sub}.normed") - beta, beta                    # γ ⊙ x̂_j; β W_V joins the bias
        summed = output = got(f"{sub}.residual")
    blocks.append(_block(f"{stack}.{i}.self_attention", attention, norm, post,
                         head_weights("self_attention", attention.heads), values, extra, x, summed, output, False))
    if memory is not None:
        sub = f"{stack}.{i}.sublayer.1"
        attention, norm = layer.cross_attention, layer.sublayer[1].layer_norm
        x = got(f"{sub}.input")
        summed = got(f"{sub}.residual")
        output = got(f"{sub}.normed") if post else summed
        blocks.append(_block(f"{stack}.{i}.cross_attention", attention, norm, post,
                             head_weights("cross_attention", attention.heads), memory, torch.zeros_like(x[0]), x,
                             summed, output, True))
    return blocks


def decompose(model, src: Tensor, tgt_in: Tensor, src_pad: Tensor | None = None) -> list[Block]:
    """Every attention block of the model, in the order they run: encoder layers, then per decoder layer
    its self-attention and its cross-attention. src (1, S), tgt_in (1, T) ids; src_pad (1, S) True = PAD."""
    rec = record(model, src, tgt_in, src_pad)
    post = model.cfg.norm_placement == "post"
    memory = rec["encoder.output"][0].cpu().double()                         # (S, d) e_j, after a final LN
    blocks: list[Block] = []
    for i, layer in enumerate(model.encoder.layers):
        blocks += _layer_blocks("encoder", i, layer, post, rec, None)
    for i, layer in enumerate(model.decoder.layers):
        blocks += _layer_blocks("decoder", i, layer, post, rec, memory)
    return blocks


def contributions(block: Block) -> Tensor:
    """ĉ_ij of one block, (n, m) — cross-attention (n, 1 + S), column 0 the residual; rows sum to 1."""
    n, width, d = block.weights.size(1), block.projected.size(1) + block.cross, block.residual.size(1)
    out = torch.zeros(n, width, dtype=torch.float64)
    step = max(1, CHUNK // max(1, width * d))
    for start in range(0, n, step):
        rows = slice(start, start + step)
        t = block.terms(rows)                                                # (rows, m, d)
        y = block.output[rows]                                               # (rows, d)
        distance = (y[:, None] - t).abs().sum(-1)                            # ‖y_i − T_i(x_j)‖₁
        out[rows] = (y.abs().sum(-1, keepdim=True) - distance).clamp(min=0)  # max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁)
    total = out.sum(-1, keepdim=True)                                        # (n, 1)
    own = torch.zeros_like(out)
    own[torch.arange(n), 0 if block.cross else torch.arange(n)] = 1.0        # the row keeps itself
    return torch.where(total > 0, out / total.clamp(min=torch.finfo(torch.float64).tiny), own)


def rollout(blocks: list[Block], source_len: int, target_len: int) -> Tensor:
    """Compose the blocks' ĉ into M (T, S + T): row t's contributions from the source and the target inputs."""
    s, t = source_len, target_len
    encoder = torch.eye(s, dtype=torch.float64)                             # C_enc, (S, S)
    m = torch.cat([torch.zeros(t, s, dtype=torch.float64), torch.eye(t, dtype=torch.float64)], 1)   # [0 | I]
    for block in blocks:
        c = contributions(block)
        if block.name.startswith("encoder."):
            encoder = c @ encoder                                            # C_enc ← Ĉ_l C_enc
        elif block.cross:
            source = torch.cat([c[:, 1:] @ encoder, torch.zeros(t, t, dtype=torch.float64)], 1)   # (T, S + T)
            m = c[:, :1] * m + source                                        # r_i M_i + Σ_j ĉ_ij [C_enc[j] | 0]
        else:
            m = c @ m                                                        # M ← Ĉ_self M
    return m


def alti_contributions(model, src: Tensor, tgt_in: Tensor, src_pad: Tensor | None = None) -> Tensor:
    """M of the whole model, (T, S + T) float64 on the CPU: source columns, then the target inputs."""
    return rollout(decompose(model, src, tgt_in, src_pad), src.size(1), tgt_in.size(1))
