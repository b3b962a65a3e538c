# %% md zh
# # 第七章　译文从哪里来：源语言占比、对齐头和一个被抓住的幻觉
#
# 第六章问的是“**为什么**是 him”。这一章把问题放大到整句译文：每个目标词有多少来自源句、多少来自已经写出的目标前缀？
# 用的是 **ALTI+**（Ferrando 等 2022）：把每个注意力块（注意力、残差、LayerNorm）按输入逐个拆开，
# 量出每个输入在这一行向量里占多少，再一层层组合起来。每一行的贡献非负、加起来正好是 1，
# 所以“源语言占比”就是源语言那几列的和。
#
# 然后看两件事：哪个交叉注意力头的最大权重最像人工标注的词对齐（**对齐头**）；以及源语言占比能不能
# 认出一个和源句无关的译文——Dale 等（2023）发现，模型“幻觉”时，ALTI+ 给出的源语言贡献偏低。
# %% md en
# # Chapter 7 — where the translation comes from: the source share, alignment heads, a hallucination caught
#
# Chapter 6 asked *why* `him`. This chapter widens the question to the whole translation: how much of each
# target word comes from the source, and how much from the target prefix already written? The tool is
# **ALTI+** (Ferrando et al. 2022): every attention block (attention, residual, LayerNorm) split input by input,
# each input's part of the row's vector measured, and the blocks composed layer by layer. Each row's
# contributions are non-negative and sum to exactly 1, so the *source share* is the sum over the source columns.
#
# Then two things: which cross-attention head's largest weight best matches hand-made word alignments (the
# **alignment heads**), and whether the source share catches a translation that has nothing to do with its
# source — Dale et al. (2023) found that when a model hallucinates, ALTI+ gives the source a low contribution.

# %% setup

# %%
from types import SimpleNamespace

import torch

from glassformer.data.tokenize import BOS
from glassformer.interpret import gold
from glassformer.interpret.hallucination import contrast_set, roc_auc, row_shares, sentence_share, teacher_forced
from glassformer.interpret.why import why, word_groups
from glassformer.lab.api import load_model

lab = load_model(MODEL_DIR)
print(lab.origin)
SOURCE = "我昨天给了他一本书。"
TARGET = "I gave him a book yesterday."

# %% md zh
# ## 1. 译文的每个词，源语言占多少
#
# 让模型贪心翻译第一课的句子，再把译文逐词做 ALTI+：第 $t$ 行的输入是 BOS、$y_1 \dots y_t$，它预测 $y_{t+1}$。
# 一个词由几个子词片段组成时取它们的行的**平均**（仍然加起来是 1）。柱子低于 0.5 的词，这一行更多地靠目标前缀
# （语言模型式的续写），而不是读源句。
# %% md en
# ## 1. How much of each word of the translation comes from the source
#
# The model translates the lesson's sentence greedily, and ALTI+ splits its translation word by word: row $t$
# has the inputs BOS, $y_1 \dots y_t$ and predicts $y_{t+1}$. A word of several sub-word pieces takes the
# **mean** of its pieces' rows (still summing to 1). A bar below 0.5 is a word whose row leans on the target
# prefix (continuing like a language model) more than on reading the source.

# %%
result = why(lab.model, lab.source, lab.target, SOURCE, None, "alti", lens=False)
words = [r["token"] for r in result["rows"]]
shares = [r["source_share"] for r in result["rows"]]
print(T("译文", "translation") + ":", result["details"]["translation"])
fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(words)), 3))
ax.bar(range(len(words)), shares, color=["#2f67c7" if s >= 0.5 else "#d6452e" for s in shares])
ax.axhline(0.5, color="gray", lw=0.8, ls="--")
ax.set_xticks(range(len(words)), words, rotation=45 if len(words) > 10 else 0)
ax.set_ylim(0, 1)
ax.set_ylabel(T("源语言占比", "source share"))
ax.set_title(T("ALTI+：每个目标词的源语言占比（其余来自目标前缀）",
               "ALTI+: the source share of each target word (the rest is the target prefix's)"), fontsize=10)
fig.tight_layout()
plt.show()
print(T("整句平均源语言占比", "mean source share of the sentence"), f"{sum(shares) / len(shares):.3f}")

# %% md zh
# ## 2. 对齐头：哪个交叉注意力头指向对的源词
#
# `glassformer.interpret.gold.load_gold()` 里是人工标注的词对齐（sure / possible 链接）。对每个交叉注意力头：
# 把几个句对的参考译文强制喂给解码器，每个目标词取一组行的权重平均，连到权重最大的源单位；
# 再把单位和词投到标注的词元上（`project_units`），算对齐错误率 AER（Och & Ney 2003，越低越好）。
# 哪组行代表一个词有两种取法：**predict**——预测这个词的那几行（最新输入是它前面的词）；
# **shift**——晚一行，最新输入就是这个词本身（Chen 等 2020 发现注意力这样对得更准）。两种都量。
# %% md en
# ## 2. Alignment heads: which cross-attention head points at the right source word
#
# `glassformer.interpret.gold.load_gold()` holds hand-made word alignments (sure / possible links). For each
# cross-attention head: teacher-force the reference of a few pairs, give each target word the mean weights of
# a set of rows, link it to its highest-weight source unit, project units and words onto the gold tokens
# (`project_units`) and score the alignment error rate, AER (Och & Ney 2003; lower is better). Which rows
# stand for a word: **predict** — the rows that predict it (their newest input is the word before); **shift** —
# one row later, whose newest input is the word itself (Chen et al. 2020 found attention aligns better so).
# Both are measured.

# %%
GOLD = gold.load_gold()[:12]
cfg = lab.model.cfg
CONVENTIONS = {"predict": 0, "shift": 1}                                  # rows: the word's pieces' labels + 0 or + 1
sites = [(c, i, h) for c in CONVENTIONS for i in range(cfg.decoder_layers) for h in range(cfg.heads)]


def read_pair(pair):
    """Units, words and each (convention, layer, head)'s (words, units) weights of one gold pair, teacher-forced."""
    enc = lab.source.analyse(pair.zh)
    ids = lab.target.encode(pair.en)
    pieces = [lab.target.id_to_token(t) or "?" for t in ids]
    groups = word_groups(pieces)                                           # piece k is predicted by row k
    with lab.model.probes("decoder.*.cross_attention.head.*.weights") as rec, torch.no_grad():
        lab.model(torch.tensor([enc.ids]), torch.tensor([[BOS, *ids]]))   # (1, tgt) = BOS y_1 … y_n
    weights = {}
    for c, i, h in sites:
        a = rec[f"decoder.{i}.cross_attention.head.{h}.weights"][0]          # (tgt, src)
        weights[(c, i, h)] = torch.stack([a[[k + CONVENTIONS[c] for k in g]].mean(0) for g in groups])  # (words, units)
    return enc.units, [lab.target.decode([ids[k] for k in g]) for g in groups], weights


def links(pair, units, words, w):
    """Each word linked to its highest-weight unit, as gold token links."""
    src_map = gold.project_units(pair.zh, units, pair.src)
    tgt_map = gold.project_units(pair.en, words, pair.tgt)
    return gold.project_links([(int(w[v].argmax()), v) for v in range(len(words))], src_map, tgt_map)


read = [read_pair(p) for p in GOLD]
aer = {site: gold.score([links(p, u, wd, w[site]) for p, (u, wd, w) in zip(GOLD, read, strict=True)], GOLD).aer
       for site in sites}                                                 # (convention, layer, head) -> AER
best = min(sites, key=aer.get)
table = [[aer[(c, i, h)] for h in range(cfg.heads)] for c in CONVENTIONS for i in range(cfg.decoder_layers)]
units, words, w = read[0]
fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [1, 2]})
heatmap(axes[0], table, rows=[f"{c} L{i}" for c in CONVENTIONS for i in range(cfg.decoder_layers)],
        cols=[f"h{h}" for h in range(cfg.heads)], cmap="viridis_r",
        title=T(f"AER，{len(GOLD)} 个标注句对（越低越好）", f"AER over {len(GOLD)} gold pairs (lower is better)"))
heatmap(axes[1], w[best], rows=words, cols=units, digits=None,
        title=T(f"最好的头 L{best[1]} h{best[2]}（{best[0]}）：{GOLD[0].zh}",
                f"the best head L{best[1]} h{best[2]} ({best[0]}): {GOLD[0].zh}"))
fig.tight_layout()
plt.show()
print(T("对齐头", "alignment head") + f": L{best[1]} h{best[2]} ({best[0]}), AER {aer[best]:.3f}; "
      + T("所有头里最差", "worst head") + f" {max(aer.values()):.3f}")

# %% md zh
# ## 3. 一个被抓住的幻觉
#
# 给源句强制喂三种译文：对的参考译文；另一句的参考译文（**swapped**，和这个源句毫无关系）；前一半对、
# 后一半换成另一句的（**half**）。错的译文由代码造出来（`contrast_set`：带种子的错位排列，保证没有哪句拿到
# 自己的译文）。如果源语言占比是幻觉信号，对的译文的占比应该更高。几句之上用 ROC AUC 量：随便抽一对
# （对的，错的），对的占比更高的概率（1 = 完全分开，0.5 = 分不开）。
#
# 在 `runs/default` 上量过（docs/attribution.md，各 200 句）：这个信号是有的，但不强——对 swapped 的 AUC 大约
# 0.62 到 0.67；而模型自己给目标的平均对数概率（Dale 等的 Seq-Logprob）几乎完全分得开（0.98）。
# 教师强制一个错译文时，模型仍然在读源句。
# %% md en
# ## 3. A hallucination caught
#
# Teacher-force three targets behind the source: the right reference; another pair's reference (**swapped**,
# nothing to do with this source); the first half right and the rest from another pair (**half**). The wrong
# targets are built by code (`contrast_set`: a seeded derangement, so no pair gets its own reference). If the
# source share is a hallucination signal, the right target's share should be higher. Over several sentences
# the ROC AUC measures it: the chance that a random (right, wrong) couple has the right one higher (1 = fully
# apart, 0.5 = no better than chance).
#
# Measured on `runs/default` (docs/attribution.md, 200 sentences each): the signal is there but weak — an AUC
# of about 0.62 to 0.67 against swapped — while the model's own mean log-probability of the target (Dale et
# al.'s Seq-Logprob) separates them almost perfectly (0.98). Teacher-forcing a wrong target, the model still
# reads its source.

# %%
pairs = [SimpleNamespace(id="lesson", zh=SOURCE, en=TARGET), *GOLD]
contrasts = contrast_set(pairs, seed=0)
kinds = ["right", "swapped", "half"]


def shares_of(c, kind):
    """The alti source share of every target row (pieces and EOS) of one of c's targets."""
    tgt_in, labels = teacher_forced(lab.model, lab.target, c.target(kind))
    return row_shares(lab.model, torch.tensor([lab.source.analyse(c.zh).ids]), tgt_in, labels, "alti")


lesson = {kind: shares_of(contrasts[0], kind) for kind in kinds}
fig, ax = plt.subplots(figsize=(8, 3))
for kind, color in zip(kinds, ["#2f67c7", "#d6452e", "#e0a030"], strict=True):
    ax.plot(range(len(lesson[kind])), lesson[kind], "o-", color=color,
            label=f"{kind}: {contrasts[0].target(kind)}")
ax.set_xlabel(T("目标行（片段，最后一行是 EOS）", "target row (pieces, the last one EOS)"))
ax.set_ylabel(T("源语言占比", "source share"))
ax.set_ylim(0, 1)
ax.set_title(T(f"ALTI+，源句 {SOURCE}", f"ALTI+, source {SOURCE}"), fontsize=10)
ax.legend(fontsize=7, loc="lower left")
fig.tight_layout()
plt.show()
for kind in kinds:
    print(f"{kind:>8s}: " + T("句子平均占比", "sentence share") + f" {sentence_share(lesson[kind]):.3f}")
every = {kind: [sentence_share(shares_of(c, kind)) for c in contrasts] for kind in kinds}
for kind in kinds[1:]:
    auc = roc_auc(every["right"], every[kind])
    print(f"ROC AUC right vs {kind}, {len(contrasts)} " + T("句", "sentences") + f": {auc:.3f}")

# %% md zh
# **试一试**：把方法换成 `"integrated-gradients"`（`row_shares(..., "integrated-gradients", steps=32)`），
# 或者在命令行上量整个测试集：`glassformer hallucination --split test --sentences 200`，
# `glassformer evaluate --split test --source-share` 给模型自己译文的源语言占比分布。
# %% md en
# **Try it**: change the method to `"integrated-gradients"` (`row_shares(..., "integrated-gradients", steps=32)`),
# or measure a whole split on the command line: `glassformer hallucination --split test --sentences 200`;
# `glassformer evaluate --split test --source-share` gives the distribution of the source share over the
# model's own translations.
