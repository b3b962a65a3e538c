# %% md zh
# # 第五章　greedy 与 beam search：一步一步，看 KV cache 长大
#
# 训练时整句右移的目标一次送进 decoder；生成时未来的词还不存在，只能一个一个追加：每一步 decoder 读“到目前为止”的
# 目标，词表头给出下一个词的概率，选中的词再送回去。KV cache 把已经算过的 key/value 存起来，
# 每一步只为新来的那一行算 Q、K、V——self-attention 的 cache 每步多一行，cross-attention 的 cache（源的 K/V）只算一次。
# %% md en
# # Chapter 5 — greedy and beam search, step by step, with the KV cache growing
#
# Training feeds the whole right-shifted target to the decoder at once; generation cannot, because the future
# words do not exist yet: each step the decoder reads the target *so far*, the vocabulary head gives the next
# word's probabilities, and the chosen word is fed back. The KV cache keeps the keys/values already computed,
# so each step computes Q, K, V for the one new row only — the self-attention cache grows by one row per step,
# the cross-attention cache (the source's K/V) is computed once.

# %% setup

# %%
import math

import torch

from glassformer.lab.api import load_model
from glassformer.lesson import examples
from glassformer.decoding.search import BeamSearch, generate, greedy, length_normalized, output_limits
from glassformer.data.tokenize import BOS, EOS

# %% md zh
# 需要训练好的翻译模型（`make demo` 会训练到 `runs/default`）才有像样的译文；没有时用种子固定、**未训练**的小模型：
# 它的“译文”没有意义，但每一步的机制完全一样。
# %% md en
# A trained translator (`make demo` trains one into `runs/default`) gives a real translation; without one the
# seeded **untrained** small model runs: its “translation” means nothing, but every step works the same way.

# %%
lab = load_model(MODEL_DIR)
model = lab.model
print(lab.origin)
source = examples.in_units(examples.NINE_UNITS)                          # 我／昨天／给／了／他／一／本／书／。
src = torch.tensor([lab.source.analyse(source).ids])                      # (1, src)
src_pad = src == model.cfg.pad_id                                         # (1, src) True = PAD
limit = int(output_limits(src_pad, model.cfg.max_len)[0])                 # at most 2·len + 10 tokens
print(T(f"{src.size(1)} 个源单位，最多生成 {limit} 个词", f"{src.size(1)} source units, at most {limit} tokens"))

# %% md zh
# ## 1. greedy：每一步取概率最大的词
#
# 编码器只跑一次，得到 $H$。然后从 BOS 开始，每一步把**一个**新词送进 `decode_step`，它读写 cache。
# 表里每一步：选中的词、它的概率、第二名，以及第 0 层 self-attention cache 里 K 的形状
# （batch, heads, 已缓存的位置, d_k）。
# %% md en
# ## 1. Greedy: take the most probable word each step
#
# The encoder runs once and gives $H$. Then, from BOS, each step feeds **one** new token to `decode_step`,
# which reads and writes the cache. Each step of the table: the chosen word, its probability, the runner-up,
# and the shape of K in layer 0's self-attention cache (batch, heads, cached positions, d_k).

# %%
with torch.no_grad():
    memory = model.encode(src, src_pad)                                   # (1, src, d)
    cache = model.new_cache()
    token, chosen, lengths = BOS, [], []
    for step in range(limit):
        logits = model.decode_step(torch.tensor([[token]]), memory, src_pad, cache)[0, -1]   # (vocab,)
        probs = torch.softmax(logits.double(), dim=-1)
        top = torch.topk(probs, 2)
        token = int(top.indices[0])
        k_self = cache.k[model.decoder.layers[0].self_attention][:, :, :cache.length]   # (batch, heads, cached, d_k)
        k_cross = cache.cross[model.decoder.layers[0].cross_attention][0]              # (batch, heads, src, d_k)
        lengths.append(cache.length)
        print(f"step {step:2d}  {lab.piece(token):>10s} p={float(top.values[0]):.3f}   "
              f"2nd {lab.piece(int(top.indices[1])):>10s} p={float(top.values[1]):.3f}   "
              f"self K {tuple(k_self.shape)}  cross K {tuple(k_cross.shape)}")
        if token == EOS:
            break
        chosen.append(token)
print(T("greedy：", "greedy:"), lab.target.decode(chosen))
print(T("与 search.greedy 相同：", "same as search.greedy:"), greedy(model, src)[0] == chosen)

# %%
fig, ax = plt.subplots(figsize=(6, 2.8))
ax.step(range(1, len(lengths) + 1), lengths, where="mid", label=T("self-attention cache（每步 +1）",
        "self-attention cache (+1 per step)"))
ax.plot(range(1, len(lengths) + 1), [src.size(1)] * len(lengths), "--",
        label=T("cross-attention cache（源，算一次）", "cross-attention cache (source, once)"))
ax.set_xlabel(T("第几步", "step"))
ax.set_ylabel(T("缓存的位置数", "cached positions"))
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% md zh
# ## 2. 用 cache 和不用 cache，数字一样
#
# 训练时的 teacher forcing 把“BOS + 已选的词”一次送进去，每一行同时得到下一个词的 logits。它和上面一步一步、
# 带 cache 的结果应当一样（只差浮点误差）。
# %% md en
# ## 2. With and without the cache, the same numbers
#
# Teacher forcing, as in training, feeds “BOS + the chosen words” at once, and every row gets its next-word
# logits together. They should equal the step-by-step, cached ones above (up to rounding).

# %%
with torch.no_grad():
    tgt_in = torch.tensor([[BOS, *chosen]])                               # (1, steps)
    forced = model(src, tgt_in)[0]                                        # (steps, vocab)
    cache = model.new_cache()
    stepped = torch.cat([model.decode_step(tgt_in[:, i:i + 1], memory, src_pad, cache)[0]
                         for i in range(tgt_in.size(1))])                 # (steps, vocab)
print(T("teacher forcing 与逐步 + cache 的最大差：", "largest gap, teacher forcing vs step by step with cache:"),
      f"{(forced - stepped).abs().max():.2e}")

# %% md zh
# ## 3. beam search：同时留 K 个候选
#
# greedy 每步只留一个词，早先的小选择可能把后面的好句子挡在外面。beam search 每步留 $K$ 个前缀（beam）：
# 把每个 beam 的 $V$ 个续写都算上，共 $K\times V$ 个候选，按累计 log 概率排序；前 $K$ 名里的 EOS 变成完成的句子，
# 其余最好的 $K$ 个继续。完成的句子按 $\text{score}/\text{len}^{\alpha}$ 比较（长度惩罚，$\alpha=1$）。
# cache 跟着 beam 走：每一步按选中的父 beam 重排（`cache.reorder`），所以 batch 维是 $K$。
#
# 下面的循环为了好读写得很直白，规则与 `glassformer.decoding.search` 的 `BeamSearch` 相同，最后两者对照。
# %% md en
# ## 3. Beam search: keep K candidates at once
#
# Greedy keeps one word per step, and an early small choice can shut out a better sentence later. Beam search
# keeps $K$ prefixes (beams): every beam's $V$ continuations make $K\times V$ candidates, ranked by summed log
# probability; an EOS among the top $K$ becomes a finished sentence, and the best $K$ others go on. Finished
# sentences compare by $\text{score}/\text{len}^{\alpha}$ (length penalty, $\alpha=1$). The cache follows the
# beams: each step it is reordered by the chosen parent beams (`cache.reorder`), so its batch size is $K$.
#
# The loop below is written plainly for reading; its rules are those of
# `BeamSearch` in `glassformer.decoding.search`, and the two are compared at the end.

# %%
K, alpha = 3, 1.0
with torch.no_grad():
    memory_k, pad_k = memory.expand(K, -1, -1), src_pad.expand(K, -1)     # (K, src, d), (K, src)
    cache = model.new_cache()
    beams = [([], 0.0)] + [([], -math.inf)] * (K - 1)                     # (tokens, summed log p); one live beam
    tokens = torch.full((K, 1), BOS)
    best = None                                                           # (tokens, score, normalised)
    history = []                                                          # per step: live (parent, token, score)
    for step in range(limit):
        logp = torch.log_softmax(model.decode_step(tokens, memory_k, pad_k, cache)[:, -1].double(), dim=-1)
        vocab = logp.size(-1)
        scores = torch.tensor([s for _, s in beams], dtype=torch.float64)[:, None] + logp   # (K, vocab)
        top_s, top_i = scores.view(-1).topk(2 * K)
        length, live = step + 1, []
        for rank, (s, flat) in enumerate(zip(top_s.tolist(), top_i.tolist(), strict=True)):
            parent, token = flat // vocab, flat % vocab
            if s == -math.inf:
                break
            if token == EOS or length >= limit:
                if rank < K:                                              # only the top K may finish
                    done = beams[parent][0] + ([] if token == EOS else [token])
                    if best is None or length_normalized(s, length, alpha) > best[2]:
                        best = (done, s, length_normalized(s, length, alpha))
            elif len(live) < K:
                live.append((parent, token, s))
        history.append(list(live))
        shown = "   ".join(f"{pa}→{k} +{lab.piece(t):<9s}{s:7.2f}" for k, (pa, t, s) in enumerate(live))
        print(f"step {step:2d}  cache {cache.length:2d}   {shown}")
        if best is not None:
            print(f"         {T('目前最好的完成句', 'best finished')}: {lab.target.decode(best[0])!r} "
                  f"score {best[1]:.2f} / len^α = {best[2]:.3f}")
        # a live beam can at best keep its score over a longer length: stop when none can beat `best`
        bound = max((max(length_normalized(s, min(length + 1, limit), alpha), length_normalized(s, limit, alpha))
                     for _, _, s in live), default=-math.inf)
        if length >= limit or not live or (best is not None and bound <= best[2]):
            break
        while len(live) < K:
            live.append((live[0][0], 0, -math.inf))                       # dead placeholder rows
        cache.reorder(torch.tensor([pa for pa, _, _ in live]))            # the cache follows the beams
        beams = [(beams[pa][0] + [t], s) for pa, t, s in live]
        tokens = torch.tensor([[t] for _, t, _ in live])
    library = generate(model, src, BeamSearch(K), alpha=alpha)[0][0]  # the best hypothesis of sentence 0
print(T("beam search：", "beam search:"), lab.target.decode(best[0]))
print(T("与 search.BeamSearch 相同：", "same as search.BeamSearch:"), library.tokens == best[0],
      f"(score {library.score:.4f})")
print(T("greedy：", "greedy:"), lab.target.decode(chosen))

# %%
# the beams step by step: each dot a live hypothesis (its newest word and summed log p), each line its parent
fig, ax = plt.subplots(figsize=(min(14, 2 + 1.3 * len(history)), 3.6))
for step, live in enumerate(history):
    for k, (parent, token, score) in enumerate(live):
        if step > 0:
            ax.plot([step - 1, step], [history[step - 1][parent][2], score], "-", color="#9aa5b1", lw=1)
        ax.plot(step, score, "o", color="#d6452e" if k == 0 else "#1f5fa8", ms=5)
        ax.annotate(lab.piece(token), (step, score), textcoords="offset points", xytext=(4, 3), fontsize=7)
if best is not None:
    ax.axhline(best[1], ls="--", color="#1d7a3a", lw=1,
               label=T(f"最好的完成句：score {best[1]:.2f}", f"best finished: score {best[1]:.2f}"))
    ax.legend(fontsize=8, loc="lower left")
ax.set_xlabel(T("第几步", "step"))
ax.set_ylabel(T("累计 log 概率", "summed log probability"))
ax.set_title(T(f"beam search，K = {K}：每一步留下的候选（红：第一名）", f"beam search, K = {K}: the hypotheses kept each step (red: the best)"),
             fontsize=10)
fig.tight_layout()
plt.show()

# %% md zh
# 每一行是一步：`父→新` 表示新 beam 由哪个旧 beam 接上哪个词，后面是累计 log 概率；“cache” 是这一步之后缓存的位置数，
# 每步加一，与 beam 数无关（beam 在 batch 维）。
#
# **试一试**：把 `K` 改成 1、`alpha` 改成 0，beam search 就退化成 greedy；或者把 `source` 换成“他／昨天／给／了／我／一／本／书／。”。
# %% md en
# Each line is one step: `parent→new` says which old beam the new beam continues and with which word, then its
# summed log probability; “cache” is the number of positions cached after the step, one more each step,
# whatever the number of beams (the beams are the batch dimension).
#
# **Try it**: set `K` to 1 and `alpha` to 0 and beam search becomes greedy; or change `source` to
# “他／昨天／给／了／我／一／本／书／。”.
