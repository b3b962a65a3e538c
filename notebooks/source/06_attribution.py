# %% md zh
# # 第六章　为什么是 him：归因、对比和逐层读出
#
# 第四章的激活修补回答了“**哪个**部件把 他 带到 him”。这一章换一个问法：对 gave 这一行的 $f=\log p(\text{him})$，
# 每个源语言单位、每个已经写出的目标词**各贡献了多少**？再问得更尖一点：“为什么是 him **而不是 her**”——
# 度量 $f=\log p(\text{him})-\log p(\text{her})$。最后把 decoder 一层一层地读出来（logit lens）：
# him 的概率是在哪个子层之后升起来的？
# %% md en
# # Chapter 6 — why *him*: attribution, the contrast, and the decoder read layer by layer
#
# Chapter 4's activation patching answered *which* component carries 他 to `him`. This chapter asks another
# way: for the gave row's $f=\log p(\text{him})$, how much does **each** source unit and each target word written
# so far contribute? Sharper: “why *him* and **not** *her*” — the quantity $f=\log p(\text{him})-\log p(\text{her})$.
# Last, the decoder read layer by layer (the logit lens): after which sub-layer does p(him) rise?

# %% setup

# %%
import torch

from glassformer.lab.api import load_model
from glassformer.interpret.attribution import attribute
from glassformer.interpret.lens import logit_lens
from glassformer.data.tokenize import BOS, EOS
from glassformer.interpret.why import why

lab = load_model(MODEL_DIR)
print(lab.origin)
SOURCE = "我／昨天／给／了／他／一／本／书／。"
TARGET = "I gave him a book yesterday."
src = torch.tensor([lab.source.analyse(SOURCE).ids])                      # (1, src)
ids = lab.target.encode(TARGET)
tgt_in = torch.tensor([[BOS, *ids]])                                      # (1, tgt): BOS I gave him …

# %% md zh
# ## 1. 三种梯度方法和一种注意力读数
#
# 每种方法给每一行一组分数：源语言的每个单位一个，这一行能看到的每个目标输入（BOS、I、gave……）一个。
# 分数在嵌入上算（`encoder.embedding` / `decoder.embedding` 两个挂钩点），沿嵌入维度求和：
#
# - **显著性**：$\sum_d |\partial f/\partial e|$，只说敏感程度，没有正负；
# - **输入 × 梯度**：$\sum_d e\cdot\partial f/\partial e$，一阶近似，有正负；
# - **积分梯度**：$\sum_d (e-e')\cdot\int_0^1 \partial f/\partial e\,(e'+\alpha(e-e'))\,d\alpha$。基线 $e'$ 是
#   “只有位置向量”的嵌入（把所有词向量去掉）。它满足**完备性**：一行的分数之和等于 $f(e)-f(e')$；
# - **注意力**：交叉注意力（源）和自注意力（目标前缀）的权重，对所有层和头取平均——它与预测哪个词无关。
#
# 为什么不用全零基线？LayerNorm 对缩放不敏感：$f(\alpha e)$ 在 $\alpha>0$ 时几乎不变，到 $\alpha\approx 0$ 才突变，
# 积分怎么加步数都算不准。
# %% md en
# ## 1. Three gradient methods and one attention reading
#
# Every method gives each row one score per source unit and one per target input the row can see (BOS, I,
# gave, …). Scores are taken at the embeddings (the hook points `encoder.embedding` / `decoder.embedding`) and
# summed over the embedding axis:
#
# - **saliency**: $\sum_d |\partial f/\partial e|$, how sensitive, without a sign;
# - **input × gradient**: $\sum_d e\cdot\partial f/\partial e$, first order, signed;
# - **integrated gradients**: $\sum_d (e-e')\cdot\int_0^1 \partial f/\partial e\,(e'+\alpha(e-e'))\,d\alpha$ with the
#   *position-only* baseline $e'$ (every token vector removed). It is **complete**: a row's scores sum to
#   $f(e)-f(e')$;
# - **attention**: cross-attention (source) and self-attention (prefix) weights, averaged over layers and
#   heads — they do not depend on which word is predicted.
#
# Why not the zero baseline? LayerNorm is scale-invariant: $f(\alpha e)$ hardly moves for $\alpha>0$ and jumps at
# $\alpha\approx 0$, and no step count integrates that.

# %%
result = why(lab.model, lab.source, lab.target, SOURCE, TARGET, "integrated-gradients")   # steps: auto
rows = result["rows"]
units = result["details"]["units"]
columns = [name for name, _ in max((r["prefix"] for r in rows), key=len)]
table = [[v for _, v in r["source"]] + [None] + [r["prefix"][k][1] if k < len(r["prefix"]) else None
                                                  for k in range(len(columns))] for r in rows]
fig, ax = plt.subplots(figsize=(10, 4))
heatmap(ax, table, rows=[r["token"] for r in rows], cols=units + ["│"] + columns, cmap="coolwarm",
        title=T("积分梯度：行是目标词，列是源单位 │ 这一行能看到的目标输入（空白 = 看不到）",
                "integrated gradients: rows are target words, columns source units │ target inputs (blank = not seen)"))
for text in ax.texts:                                                     # a cell the row cannot see: blank
    if text.get_text() == "−∞":
        text.set_text("")
fig.tight_layout()
plt.show()
for r in rows:
    print(f"{r['token']:>10s}  Σ {r['sum']:+.4f}   f(e) − f(e') {r['delta']:+.4f}")
worst = max(abs(r["sum"] - r["delta"]) / max(abs(r["delta"]), 1e-9) for r in rows)
print(T("完备性，最大相对差", "completeness, largest relative gap"), f"{worst:.4f}")

# %% md zh
# 看不到的目标输入（gave 那一行之后的词）得分**恰好**是 0：三角掩码挡住了它们，梯度一点也流不过去。
# %% md en
# The target inputs a row cannot see (the words after it) score **exactly** 0: the triangle hides them and no
# gradient flows through.

# %%
n = tgt_in.size(1)
a = attribute(lab.model, src, tgt_in, list(range(n)), [*ids, EOS], "input-x-gradient")   # every piece row
future = sum(float(a.prefix[r, r + 1:].abs().sum()) for r in range(n))
print(T("所有行在看不到的目标输入上的 |分数| 之和", "sum of |scores| on target inputs a row cannot see"), future)

# %% md zh
# ## 2. 对比：为什么是 him 而不是 her
#
# 在 gave 那一行，$f=\log p(\text{him})-\log p(\text{her})$。两个词共用的部分（比如“这里该是一个宾语代词”）在差里消掉，
# 剩下的是**区分**它们的证据：预期落在 他 上。反过来问“her 而不是 him”，每个分数正好变号（反对称）。
# %% md en
# ## 2. The contrast: why him and not her
#
# At the gave row, $f=\log p(\text{him})-\log p(\text{her})$. What the two words share (“an object pronoun goes
# here”) cancels in the difference; what is left is the evidence that **tells them apart**: expected on 他.
# Asked the other way round (“her, not him”), every score flips its sign (antisymmetry).

# %%
row = len(lab.target.encode("I gave"))                                    # the row whose newest input is gave
him, her = lab.target.token_to_id(lab.target.tokens("him")[0]), lab.target.token_to_id(lab.target.tokens("her")[0])
fig, axes = plt.subplots(1, 2, figsize=(10, 3), sharey=False)
for ax, method in zip(axes, ["integrated-gradients", "input-x-gradient"], strict=True):
    a = attribute(lab.model, src, tgt_in, [row], [him], method, contrast=[her], steps=64)
    b = attribute(lab.model, src, tgt_in, [row], [her], method, contrast=[him], steps=64)
    scores = a.source[0].tolist()
    top = max(range(len(units)), key=lambda j: abs(scores[j]))
    ax.bar(range(len(units)), scores, color=["#d6452e" if v >= 0 else "#2f67c7" for v in scores])
    ax.set_xticks(range(len(units)), units)
    ax.set_title(f"{method}: log p(him) − log p(her)", fontsize=9)
    print(f"{method:>22s}: " + T("最大的源分数", "largest source score") + f" {units[top]} {scores[top]:+.4f}   "
          + T("反对称", "antisymmetry") + f" max |a(him,her) + a(her,him)| = {float((a.source + b.source).abs().max()):.1e}")
fig.tight_layout()
plt.show()

# %% md zh
# ## 3. 逐层读出（logit lens）
#
# 把 gave 那一行在每个 decoder 子层（自注意力、交叉注意力、FFN）之后的向量直接送进词表头，看 p(him) 和 p(her)。
# 后置归一化（这个模型）里每个子层的输出已经过 LayerNorm，可以直接读；前置归一化要先过 decoder 最后的 LayerNorm。
# 最后一个子层之后的读数就是模型自己的概率。
# %% md en
# ## 3. The decoder read layer by layer (the logit lens)
#
# Put the gave row's vector after each decoder sub-layer (self-attention, cross-attention, FFN) straight into
# the vocabulary head and read p(him) and p(her). In a post-norm model (this one) every sub-layer's output has
# been through its LayerNorm and is read directly; a pre-norm model needs the decoder's final LayerNorm first.
# The reading after the last sub-layer is the model's own probability.

# %%
lens = logit_lens(lab.model, src, tgt_in, row, him, her)
labels = [f"L{s['layer']}\n{s['name']}" for s in lens["steps"]]
fig, ax = plt.subplots(figsize=(8, 3))
ax.plot(range(len(labels)), [s["p"] for s in lens["steps"]], "o-", color="#d6452e", label="p(him)")
ax.plot(range(len(labels)), [s["p_contrast"] for s in lens["steps"]], "o-", color="#2f67c7", label="p(her)")
ax.set_xticks(range(len(labels)), labels, fontsize=8)
ax.set_ylabel(T("概率", "probability"))
reading_zh = ("后置归一化：每个子层的 LayerNorm 输出直接读" if lab.model.cfg.norm_placement == "post"
              else "前置归一化：残差流先过 decoder 最后的 LayerNorm 再读")
ax.set_title(T(reading_zh, lens["reading"]), fontsize=9)
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
print(T("最后一个子层的读数与模型本身之差", "last sub-layer reading minus the model's own"),
      f"|Δp| = {abs(lens['steps'][-1]['p'] - lens['p_model']):.1e}")

# %% md zh
# **试一试**：把 `SOURCE` 里的 他 换成 她，或者把方法换成 `"saliency"`、`"attention"`，看图怎么变。命令行上同样的事：
# `glassformer attribute 我昨天给了他一本书。 --target "I gave him a book yesterday." --contrast her`，
# 加 `--lens` 看逐层读出。
# %% md en
# **Try it**: change 他 to 她 in `SOURCE`, or the method to `"saliency"` or `"attention"`, and see how the
# pictures move. The same on the command line:
# `glassformer attribute 我昨天给了他一本书。 --target "I gave him a book yesterday." --contrast her`, and
# `--lens` for the layer-by-layer reading.
