# %% md zh
# # 第二章　mask：两句话的 batch、因果表、padding 与 loss mask
#
# 课文的 batch 有两句话：A “我／昨天／给了／她／一本／书”（六个单位），B “她／笑了”（两个单位，后面补四个 PAD）。
# 长度不同的句子放进同一个张量，需要两种 mask：**padding**（不许读 PAD）和 **causal**（目标行不许读未来）；
# 算 loss 时还要 **loss mask**（PAD 标签不计入）。全项目一个约定：布尔值，True = 可以读；padding 标记 True = PAD。
# %% md en
# # Chapter 2 — masks: the two-sentence batch, the causal table, padding and the loss mask
#
# The lesson's batch holds two sentences: A 我／昨天／给了／她／一本／书 (six units) and B 她／笑了 (two units,
# padded with four PAD). Sentences of different lengths in one tensor need two masks: **padding** (never read
# a PAD) and **causal** (a target row never reads the future); the loss needs a **loss mask** (PAD labels do
# not count). One convention throughout: boolean, True = may attend; padding flags True = PAD.

# %% setup

# %%
import torch

from glassformer.lesson import examples
from glassformer.model import ModelConfig, Transformer, causal_mask, combine, loss_mask, padding_mask

src_vocab, tgt_vocab = examples.SOURCE_VOCAB, examples.TARGET_VOCAB
src = torch.tensor([examples.ids(s, src_vocab) for s in examples.BATCH_SOURCE])            # (batch, src)
tgt_in = torch.tensor([examples.ids(t, tgt_vocab) for t in examples.BATCH_TARGET_INPUT])   # (batch, tgt)
labels = torch.tensor([examples.ids(t, tgt_vocab) for t in examples.BATCH_LABELS])         # (batch, tgt)
for name, rows in ((T("源", "source"), examples.BATCH_SOURCE), (T("目标输入", "target input"),
                   examples.BATCH_TARGET_INPUT), (T("标签", "labels"), examples.BATCH_LABELS)):
    for sample, row in zip("AB", rows, strict=True):
        print(f"{name:12s} {sample}: " + " ".join(f"{u:6s}" for u in row))
print("src ids", src.tolist())

# %% md zh
# ## 1. 每一张 mask
#
# - encoder self-attention：每个 query 行都能读同一句里的全部**真实**源位置，B 的 PAD 列全是 False；
# - 目标 6×6 causal 表：第 i 行只读位置 0…i（课文在“causal允许矩阵为：”之后没有印出这张表，这里由 `causal_mask(6)` 算出）；
# - decoder masked self-attention：causal 与目标 padding 取“与”；
# - cross-attention：目标行读源，只挡源 PAD，**没有**三角；
# - loss mask：哪些标签计入 loss。
# %% md en
# ## 1. Every mask
#
# - encoder self-attention: every query row reads all **real** source positions of its own sentence; B's PAD
#   columns are all False;
# - the 6×6 target causal table: row i reads positions 0…i only (the lesson's text stops at “causal允许矩阵为：”
#   without the table; here `causal_mask(6)` computes it);
# - decoder masked self-attention: causal AND target padding;
# - cross-attention: target rows read the source; only source PAD is blocked, **no** triangle;
# - loss mask: which labels count in the loss.

# %%
src_pad = src == src_vocab[examples.PAD]                                  # (batch, src) True = PAD
tgt_pad = tgt_in == tgt_vocab[examples.PAD]                               # (batch, tgt) True = PAD
n_src, n_tgt = src.size(1), tgt_in.size(1)
causal = causal_mask(n_tgt)                                               # (tgt, tgt)
encoder_self = padding_mask(src_pad)[:, 0].expand(-1, n_src, -1)          # (batch, src, src)
decoder_self = combine(causal, padding_mask(tgt_pad)[:, 0])               # (batch, tgt, tgt)
cross = padding_mask(src_pad)[:, 0].expand(-1, n_tgt, -1)                 # (batch, tgt, src)
counts = loss_mask(labels, tgt_vocab[examples.PAD])                       # (batch, tgt)

as_mask = {"digits": 0, "cmap": "Greens", "vmin": 0, "vmax": 1}   # 1 = True, 0 = False
fig, axes = plt.subplots(2, 4, figsize=(17, 8))
for b, sample in enumerate("AB"):
    s, t = examples.BATCH_SOURCE[b], examples.BATCH_TARGET_INPUT[b]
    heatmap(axes[b, 0], encoder_self[b].int(), s, s, f"{sample}: encoder self", **as_mask)
    heatmap(axes[b, 1], decoder_self[b].int(), t, t, f"{sample}: decoder masked self", **as_mask)
    heatmap(axes[b, 2], cross[b].int(), t, s, f"{sample}: cross (tgt × src)", **as_mask)
heatmap(axes[0, 3], causal.int(), range(6), range(6), T("causal 表 6×6", "causal table 6×6"), **as_mask)
heatmap(axes[1, 3], counts.int(), ["A", "B"], [f"{i}" for i in range(n_tgt)], T("loss mask（标签计入）",
        "loss mask (label counts)"), **as_mask)
for ax in axes[:, :3].flat:
    ax.set_xlabel("key")
    ax.set_ylabel("query")
fig.tight_layout()
plt.show()
print(T("计入 loss 的标签：", "labels counted in the loss:"), counts.sum(dim=1).tolist(), "=", int(counts.sum()))

# %% md zh
# ## 2. loss 里真的只有 9 项
#
# 用一个随机初始化（种子固定、未训练）的小模型算这个 batch 的 loss。`Transformer.loss` 返回 loss 之和与计入的
# 标签个数：A 的 6 个加上 B 的 3 个。下面三次改动检验 mask 是否真的起作用：
#
# 1. 把 B 在 PAD 位置上的**目标输入**换成别的词：loss 不变（那些行的标签不计入，前面的行因 causal 读不到它们）；
# 2. 把 B 在 PAD 位置上的**源**换成真实的词，但 padding 标记照旧：loss 不变（padding mask 挡住了它们）；
# 3. 同样的源，但忘了 padding 标记：loss 变了。
# %% md en
# ## 2. The loss really has 9 terms
#
# A small model with seeded random weights (untrained) computes the loss of this batch. `Transformer.loss`
# returns the summed loss and the number of labels counted: A's 6 plus B's 3. Three changes test whether the
# masks do their job:
#
# 1. replace B's **target inputs** at PAD positions by other words: the loss stays (those rows' labels do not
#    count, and the earlier rows cannot see them through the causal mask);
# 2. replace B's **source** at PAD positions by real words but keep the padding flags: the loss stays (the
#    padding mask hides them);
# 3. the same source without the padding flags: the loss changes.

# %%
cfg = ModelConfig.tiny(src_vocab=len(src_vocab), tgt_vocab=len(tgt_vocab))
torch.manual_seed(0)
model = Transformer(cfg).eval()
with torch.no_grad():
    loss, n = model.loss(src, tgt_in, labels)
    tgt_changed = tgt_in.clone()
    tgt_changed[1, 3:] = tgt_vocab["book"]                                 # B's EOS and PAD inputs
    loss_tgt, _ = model.loss(src, tgt_changed, labels)
    src_changed = src.clone()
    src_changed[1, 2:] = src_vocab["书"]                                   # real words where B had PAD
    loss_src, _ = model.loss(src_changed, tgt_in, labels, src_pad=src_pad)
    loss_forgot, _ = model.loss(src_changed, tgt_in, labels, src_pad=torch.zeros_like(src_pad))
    loss_a, n_a = model.loss(src[:1], tgt_in[:1], labels[:1])
    loss_b, n_b = model.loss(src[1:], tgt_in[1:], labels[1:])
print(T(f"loss 之和 {loss:.6f}，计入 {n} 个标签（A {n_a} + B {n_b}）",
        f"summed loss {loss:.6f} over {n} labels (A {n_a} + B {n_b})"))
print(T("1. 改 B 的 PAD 目标输入：", "1. B's PAD target inputs changed:"), f"{loss_tgt:.6f}")
print(T("2. 改 B 的 PAD 源，标记照旧：", "2. B's PAD source changed, flags kept:"), f"{loss_src:.6f}")
print(T("3. 同样的源，忘了 padding 标记：", "3. same source, padding flags forgotten:"), f"{loss_forgot:.6f}")
print(T("A 单独 + B 单独：", "A alone + B alone:"), f"{loss_a + loss_b:.6f}",
      T("（与整个 batch 相同：padding 不会把两句话混在一起）", "(the same as the batch: padding keeps them apart)"))

# %% md zh
# ## 3. 在 attention 里看 mask 起作用
#
# 用 `model.probes` 录下第 0 层的 attention 权重：B 的每一行对 PAD 列的权重都是 0，decoder 的右上三角也都是 0——
# mask 在 softmax 之前把这些分数设为 −∞。
# %% md en
# ## 3. The masks at work inside attention
#
# `model.probes` records layer 0's attention weights: every row of B puts weight 0 on the PAD columns, and the
# decoder's upper triangle is 0 everywhere — the mask sets those scores to −∞ before the softmax.

# %%
with torch.no_grad(), model.probes("encoder.0.self_attention.head.0.*", "decoder.0.self_attention.head.0.weights",
                                   "decoder.0.cross_attention.head.0.weights") as rec:
    model(src, tgt_in)
encoder_w = rec["encoder.0.self_attention.head.0.weights"]                 # (batch, query, key)
decoder_w = rec["decoder.0.self_attention.head.0.weights"]                 # (batch, query, key)
cross_w = rec["decoder.0.cross_attention.head.0.weights"]                  # (batch, tgt, src)
print(T("B 在 PAD 列上的最大权重（encoder / cross）：", "B's largest weight on PAD columns (encoder / cross):"),
      float(encoder_w[1][:, src_pad[1]].max()), float(cross_w[1][:, src_pad[1]].max()))
print(T("decoder 右上三角的最大权重：", "largest decoder weight above the diagonal:"), float(decoder_w.triu(1).max()))
fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
s_b, t_a = examples.BATCH_SOURCE[1], examples.BATCH_TARGET_INPUT[0]
heatmap(axes[0], rec["encoder.0.self_attention.head.0.scaled_scores"][1], s_b, s_b, "B: encoder scaled scores")
heatmap(axes[1], encoder_w[1], s_b, s_b, "B: encoder weights")
heatmap(axes[2], decoder_w[0], t_a, t_a, "A: decoder masked weights")
fig.tight_layout()
plt.show()

# %% md zh
# **试一试**：在 `decoder_self` 里去掉 `causal`，看 B 的第 0 行能读到哪些位置；或把 `tgt_changed[1, 3:]` 改成
# `tgt_changed[1, 1:]`，这次改到了计入 loss 的行，loss 就会变。
# %% md en
# **Try it**: drop `causal` from `decoder_self` and see which positions row 0 of B can read; or change
# `tgt_changed[1, 3:]` to `tgt_changed[1, 1:]`: this time rows that count are changed, and the loss moves.

# %% md zh
# ## 轮到你：因果 mask
#
# 写 `causal_mask(n)`：n×n 的布尔表，True = 可以看，第 i 行看第 0..i 列（包括自己）。下面这一版取了上三角，
# 运行检查，看它说的是哪两个错误，再改对。
# %% md en
# ## Your turn: the causal mask
#
# Write `causal_mask(n)`: an n×n boolean table, True = may attend, row i seeing columns 0..i (itself
# included). The version below takes the upper triangle: run the check, read which two mistakes it names,
# and fix it.

# %%
from glassformer.lesson.exercises import check_function


def causal_mask(n):
    """(n, n) bool, True = may attend."""
    return np.triu(np.ones((n, n), dtype=bool))


check_function(causal_mask, task="causal-mask", lang=LANG)
