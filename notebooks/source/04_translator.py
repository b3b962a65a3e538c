# %% md zh
# # 第四章　完整的翻译模型：九个单位，一次预测 him
#
# 源句“我／昨天／给／了／他／一／本／书／。”，目标输入是右移后的 BOS、I、gave、him、a、book、yesterday、句号。
# 这一章把整句送进翻译模型一次，用 `model.probes(...)` 录下每一张 attention 表和词表头的 logits：
# encoder self-attention（9×9）、decoder masked self-attention（三角）、cross-attention 在 `gave` 这一行读了哪些源单位，
# 以及 `gave` 行给 him 的概率和其他候选（目标词表若把词切成子词，`gave` 行指 gave 的最后一片，him 指它的第一片）。最后用 `model.intervene(...)` 做 activation patching：哪些 head 把“他”带到了 him。
# %% md en
# # Chapter 4 — the whole translator: nine units, one prediction of *him*
#
# The source 我／昨天／给／了／他／一／本／书／。 (“I yesterday gave (done) him one (measure) book.”), and the
# right-shifted target input BOS, I, gave, him, a, book, yesterday, full stop. This chapter sends the sentence
# through the translator once and records, with `model.probes(...)`, every attention table and the vocabulary
# logits: encoder self-attention (9×9), decoder masked self-attention (a triangle), which source units
# cross-attention reads at the `gave` row, and the probability the `gave` row gives to *him* with its rivals
# (where the target vocabulary cuts words into pieces, the `gave` row is gave's last piece and *him* its first).
# Finally `model.intervene(...)` does activation patching: which heads carry 他 to *him*.

# %% setup

# %%
import torch

from glassformer.lab.api import load_model
from glassformer.lesson import examples
from glassformer.data.tokenize import BOS

# %% md zh
# **这一章需要训练好的翻译模型**（`make demo` 会训练到 `runs/default`，或用 `GLASSFORMER_MODEL` 指向别的训练结果）。
# 没有时，下面会说明并改用种子固定、**未训练**的小模型：表的形状、mask 和每一步计算都一样，但权重是随机的，
# 看到的注意力和概率没有语言学意义。
# %% md en
# **This chapter needs a trained translator** (`make demo` trains one into `runs/default`, or point
# `GLASSFORMER_MODEL` at another run). Without one it says so below and uses the seeded **untrained** small
# model: the shapes of the tables, the masks and every step of the computation are the same, but the weights
# are random, so the attention and probabilities you see carry no linguistic meaning.

# %%
lab = load_model(MODEL_DIR)
model = lab.model
print(lab.origin)
if not lab.trained:
    print(T("⚠ 未训练的模型：下面的图只展示结构，不展示模型学到了什么。",
            "⚠ untrained model: the figures below show the structure, not what a model learns."))
cfg = model.cfg
print(f"{cfg.encoder_layers}+{cfg.decoder_layers} layers, d = {cfg.d_model}, {cfg.heads} heads")

source = "／".join(examples.NINE_UNITS)
encoding = lab.source.analyse(source)
units = encoding.units
src = torch.tensor([encoding.ids])                                        # (1, 9)
target_ids = lab.target.encode(examples.LESSON_TARGET)                  # "I gave him a book yesterday."
tgt_in = torch.tensor([[BOS, *target_ids]])                               # (1, tgt): right-shifted
targets = [lab.piece(int(t)) for t in tgt_in[0]]
gave = len(lab.target.encode("I gave"))         # the row of gave's last piece (BOS is row 0): it predicts him
print(T("源：", "source:"), units, T(" 未知：", " unknown:"), encoding.unknown)
print(T("目标输入：", "target input:"), targets, T(f"；gave 在第 {gave} 行", f"; gave is row {gave}"))

# %% md zh
# ## 1. 一次前向，录下所有 attention 表
#
# `model.probes(模式, ...)` 是一个 with 块：块里的前向会把名字匹配的中间量录下来（`*` 可跨过点号），名字见
# docs/probes.md。`model.hook_names()` 列出所有可录的名字。
# %% md en
# ## 1. One forward pass, every attention table recorded
#
# `model.probes(pattern, ...)` is a with-block: the forward pass inside it records the intermediates whose names
# match (`*` spans dots); the names are listed in docs/probes.md, and `model.hook_names()` gives them all.

# %%
print(len(model.hook_names()), T("个可录的名字，例如", "names can be recorded, e.g."), model.hook_names()[:4])
with torch.no_grad(), model.probes("*.self_attention.head.*.weights", "decoder.*.cross_attention.head.*.weights",
                                   "logits") as rec:
    logits = model(src, tgt_in)                                           # (1, tgt, vocab)
print(T(f"录下 {len(list(rec))} 个量；", f"{len(list(rec))} values recorded; "),
      "encoder.0.self_attention.head.0.weights:", tuple(rec["encoder.0.self_attention.head.0.weights"].shape))

# %% md zh
# ## 2. encoder self-attention：9×9
#
# 每个源单位都是一行 query，对九个 key 归一化（每行和为 1）。下面是最后一层的每一个 head。
# %% md en
# ## 2. Encoder self-attention: 9×9
#
# Every source unit is a query row, normalised over the nine keys (each row sums to 1). Below: every head of
# the last layer.

# %%
last = cfg.encoder_layers - 1
fig, axes = plt.subplots(1, cfg.heads, figsize=(3.2 * cfg.heads, 3.4), squeeze=False)
for h, ax in enumerate(axes[0]):
    weights = rec[f"encoder.{last}.self_attention.head.{h}.weights"][0]   # (query, key)
    heatmap(ax, weights, units, units, f"encoder.{last} head {h}", digits=None)
fig.tight_layout()
plt.show()

# %% md zh
# ## 3. decoder masked self-attention：只看自己和左边
#
# 目标行 i 只能读位置 0…i：右上三角的权重全是 0。`gave` 这一行只看 BOS、I、gave 三项。
# %% md en
# ## 3. Decoder masked self-attention: itself and the left only
#
# Target row i reads positions 0…i only: every weight above the diagonal is 0. The `gave` row sees BOS, I and
# gave, nothing else.

# %%
last = cfg.decoder_layers - 1
fig, axes = plt.subplots(1, cfg.heads, figsize=(3.2 * cfg.heads, 3.4), squeeze=False)
for h, ax in enumerate(axes[0]):
    weights = rec[f"decoder.{last}.self_attention.head.{h}.weights"][0]   # (query, key)
    heatmap(ax, weights, targets, targets, f"decoder.{last} self head {h}", digits=None)
fig.tight_layout()
plt.show()
future = torch.stack([rec[f"decoder.{i}.self_attention.head.{h}.weights"][0].triu(1)
                      for i in range(cfg.decoder_layers) for h in range(cfg.heads)])
print(T("读到未来位置的权重之和（所有层、所有 head）：", "weight on future positions (all layers and heads):"),
      float(future.sum()))

# %% md zh
# ## 4. cross-attention：`gave` 这一行读了源句的哪里
#
# Q 来自 decoder 的 `gave` 行，K/V 来自 encoder 的最终输出 $H$。每层一张表：一行一个 head，一列一个源单位。
# %% md en
# ## 4. Cross-attention: where the `gave` row reads the source
#
# Q comes from the decoder's `gave` row, K/V from the encoder's final output $H$. One table per layer: a row per
# head, a column per source unit.

# %%
fig, axes = plt.subplots(1, cfg.decoder_layers, figsize=(5.5 * cfg.decoder_layers, 0.5 * cfg.heads + 1.6),
                         squeeze=False)
for i, ax in enumerate(axes[0]):
    table = torch.stack([rec[f"decoder.{i}.cross_attention.head.{h}.weights"][0, gave]
                         for h in range(cfg.heads)])                      # (heads, src)
    heatmap(ax, table, [f"head {h}" for h in range(cfg.heads)], units, f"decoder.{i} cross-attention, gave")
fig.tight_layout()
plt.show()

# %% md zh
# ## 5. p(him)：`gave` 行的下一个词
#
# 词表头把 `gave` 行的 decoder 输出变成每个目标词的分数（logits），softmax 之后是概率。
# %% md en
# ## 5. p(him): the next word at the `gave` row
#
# The vocabulary head turns the `gave` row's decoder output into a score per target word (logits); softmax makes
# them probabilities.

# %%
probs = torch.softmax(rec["logits"][0, gave].double(), dim=-1)           # (vocab,)
him = int(tgt_in[0, gave + 1])                                            # the label of the gave row
top = torch.topk(probs, min(8, probs.numel()))
rank = int((probs > probs[him]).sum()) + 1
print(T(f"p(him) = {float(probs[him]):.4f}，排第 {rank}", f"p(him) = {float(probs[him]):.4f}, rank {rank}"))
for p, t in zip(top.values.tolist(), top.indices.tolist(), strict=True):
    print(f"  {lab.piece(t):>12s}  {p:.4f}")
fig, ax = plt.subplots(figsize=(7, 2.8))
ax.bar([lab.piece(t) for t in top.indices.tolist()], top.values.numpy(),
       color=["tab:red" if t == him else "tab:blue" for t in top.indices.tolist()])
ax.set_ylabel("p")
ax.set_title(T("gave 行的下一个词：前几名（红色是 him）", "next word at the gave row: the top candidates (him in red)"))
fig.tight_layout()
plt.show()

# %% md zh
# ## 6. 哪些 head 把“他”带到 him：activation patching
#
# 把“他”换成“她”，p(him) 应当下降。然后逐个 cross-attention head：在“她”的那次运行里，把这个 head 的输出换成
# “他”那次运行录下的值（`model.intervene`），看 p(him) 回来了多少：
# $\text{恢复} = \dfrac{p_\text{patched}-p_\text{她}}{p_\text{他}-p_\text{她}}$。接近 1 的 head 单独就把“他”的信息带到了 him。
# %% md en
# ## 6. Which heads carry 他 to *him*: activation patching
#
# Replace 他 (“him”) by 她 (“her”) and p(him) should drop. Then, one cross-attention head at a time: in the 她 run,
# replace that head's output by the value recorded in the 他 run (`model.intervene`) and see how much of p(him)
# comes back: $\text{restored} = \dfrac{p_\text{patched}-p_\text{她}}{p_\text{他}-p_\text{她}}$. A head near 1
# carries the information about 他 to *him* on its own.

# %%
corrupt_units = [("她" if u == "他" else u) for u in units]
src_corrupt = torch.tensor([lab.source.analyse("／".join(corrupt_units)).ids])       # (1, 9)
pattern = "decoder.*.cross_attention.head.*.output"


def p_him(source_ids, fns=None):
    with torch.no_grad(), model.intervene(fns or {}):
        return float(torch.softmax(model(source_ids, tgt_in)[0, gave].double(), dim=-1)[him])


with torch.no_grad(), model.probes(pattern) as clean:
    model(src, tgt_in)
p_clean, p_corrupt = p_him(src), p_him(src_corrupt)
print(f"p(him | 他) = {p_clean:.4f}   p(him | 她) = {p_corrupt:.4f}")
if abs(p_clean - p_corrupt) < 1e-6:
    print(T("两次运行的 p(him) 几乎相同，比例没有意义。",
            "p(him) hardly differs between the runs: the shares mean nothing."))
restored = np.zeros((cfg.decoder_layers, cfg.heads))
for i in range(cfg.decoder_layers):
    for h in range(cfg.heads):
        name = f"decoder.{i}.cross_attention.head.{h}.output"
        patched = p_him(src_corrupt, {name: lambda value, name: clean[name]})
        restored[i, h] = (patched - p_corrupt) / max(p_clean - p_corrupt, 1e-12, key=abs)
everything = {name: (lambda value, name: clean[name]) for name in clean}   # every head of every layer at once
share_all = (p_him(src_corrupt, everything) - p_corrupt) / max(p_clean - p_corrupt, 1e-12, key=abs)
print(T(f"所有 head 一起换回：恢复 {share_all:.3f}"
          "（源句只经 cross-attention 进入 decoder）",
        f"all heads patched at once: {share_all:.3f} restored (the source reaches the decoder only through "
        "cross-attention)"))
fig, ax = plt.subplots(figsize=(1.2 * cfg.heads + 2, 0.6 * cfg.decoder_layers + 1.6))
heatmap(ax, restored, [f"decoder.{i}" for i in range(cfg.decoder_layers)], [f"head {h}" for h in range(cfg.heads)],
        T("恢复的 p(him) 比例", "share of p(him) restored"), cmap="coolwarm")
fig.tight_layout()
plt.show()

# %% md zh
# 同样的扫描在 glassformer 里是一个函数：`glassformer.interpret.patching.lesson_patching`（命令行是
# `glassformer patch`，实验室里也有这张表）。它一次做两种破坏——“他”换成“她”，以及交换“我”与“他”——
# 返回每一层、每一个 head 恢复的比例。上面手写的循环与它对照。
# %% md en
# The same scan is one function in glassformer: `glassformer.interpret.patching.lesson_patching` (on the
# command line `glassformer patch`; the lab shows the same table). It runs both corruptions — 他 replaced by
# 她, and 我 swapped with 他 — and returns the restored share for every layer and head. The hand-written loop
# above is compared with it.

# %%
from glassformer.interpret.patching import lesson_patching

nine = "／".join(units)
corruptions = ("／".join(corrupt_units), "／".join(units[4:5] + units[1:4] + units[0:1] + units[5:]))
scan = lesson_patching(model, lab.source, lab.target, clean=nine, corrupt=corruptions, positions=False)
fig, axes = plt.subplots(1, len(scan["runs"]), figsize=(5.5 * len(scan["runs"]), 0.6 * cfg.decoder_layers + 1.8),
                         squeeze=False)
for ax, run in zip(axes[0], scan["runs"], strict=True):
    shares = [[np.nan if cell["fraction"] is None else cell["fraction"] for cell in layer] for layer in run["heads"]]
    heatmap(ax, shares, [f"decoder.{i}" for i in range(cfg.decoder_layers)], [f"head {h}" for h in range(cfg.heads)],
            " ".join(run["units"]), cmap="coolwarm")
    print(f"{' '.join(run['units'])}:  p(him) {run['p_clean']:.4f} → {run['p_corrupt']:.4f}")
fig.tight_layout()
plt.show()
mine = np.array([[np.nan if c["fraction"] is None else c["fraction"] for c in layer]
                 for layer in scan["runs"][0]["heads"]])                  # the 她 run, as the loop above
print(T("手写循环与 lesson_patching 的最大差：", "largest gap, hand-written loop vs lesson_patching:"),
      f"{np.nanmax(np.abs(mine - restored)):.1e}")

# %% md zh
# **试一试**：在手写循环里把“她”换成交换“我”和“他”（“他／昨天／给／了／我／…”）；或者调用
# `lesson_patching(..., positions=True)`：它还会逐层逐个源位置地替换 encoder 的表示（`run["positions"]`），
# 看“他”的信息写在源句的哪里、哪一层。
# %% md en
# **Try it**: instead of 她, swap 我 and 他 (“他／昨天／给／了／我／…”) in the hand-written loop; or call
# `lesson_patching(..., positions=True)`: it also patches each encoder position layer by layer
# (`run["positions"]`), showing where in the source, and how deep, 他 is written.
