# %% md zh
# # 第三章　位置：正弦表，以及交换“我”与“他”
#
# 没有位置时，self-attention 只看“有哪些 token”，不看“谁在哪里”：把输入的行重排，输出按同一置换重排
# （等变，$Y'=PY$）。于是“我给他”与“他给我”只是同一组行换了次序。2017 年的做法是给第 i 行加上位置向量：
# $X_i=E[x_i]\sqrt d+p_i$；token 交换了，位置向量却留在原处，模型就能同时用内容和顺序。
# %% md en
# # Chapter 3 — positions: the sinusoidal table, and swapping 我 and 他
#
# Without positions, self-attention sees *which* tokens there are, not *where* they are: permute the input
# rows and the outputs are permuted the same way (equivariance, $Y'=PY$). 我给他 (“I give him”) and 他给我
# (“he gives me”) are then the same rows in another order. The 2017 answer adds a position vector to row i:
# $X_i=E[x_i]\sqrt d+p_i$; the tokens swap but the position vectors stay where they are, so the model can use
# content and order together.

# %% setup

# %%
import torch

from glassformer.lab.api import load_model
from glassformer.lesson import examples
from glassformer.model import sinusoidal_positions

# %% md zh
# ## 1. 正弦位置表
#
# $PE(p,2r)=\sin(p/10000^{2r/d})$，$PE(p,2r+1)=\cos(p/10000^{2r/d})$。每一行是一个位置，每一列是一个频率：
# 左边的列变化快，右边的列变化慢。
# %% md en
# ## 1. The sinusoidal table
#
# $PE(p,2r)=\sin(p/10000^{2r/d})$, $PE(p,2r+1)=\cos(p/10000^{2r/d})$. Each row is a position, each column a
# frequency: the columns on the left change fast, those on the right slowly.

# %%
n, d = 64, 128
table = sinusoidal_positions(n, d, torch.float64).numpy()                 # (position, feature)
p = np.arange(n)[:, None]
r = np.arange(d // 2)[None, :]
formula = np.zeros((n, d))
formula[:, 0::2] = np.sin(p / 10000 ** (2 * r / d))
formula[:, 1::2] = np.cos(p / 10000 ** (2 * r / d))
print(T("与公式逐格对照，最大差：", "largest gap to the formula, cell by cell:"), np.abs(table - formula).max())

fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4), gridspec_kw={"width_ratios": [3, 2]})
image = left.imshow(table, cmap="RdBu", aspect="auto")
left.set_xlabel(T("特征 2r / 2r+1", "feature 2r / 2r+1"))
left.set_ylabel(T("位置 p", "position p"))
left.set_title(f"sinusoidal_positions({n}, {d})")
fig.colorbar(image, ax=left)
for column in (0, 2, 10, 40):
    right.plot(table[:, column], label=f"{T('列', 'column')} {column}")
right.set_xlabel(T("位置 p", "position p"))
right.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% md zh
# ## 2. 交换“我”与“他”
#
# 这里需要一个翻译模型：有训练好的（`make demo` 会训练到 `runs/default`）就用它，没有就用种子固定、**未训练**的
# 小模型——它的输出没有意义，但“有没有位置”的差别照样看得清。`lab.no_positions` 是同一组权重、位置关掉
# （`positions="none"`）的孪生模型。
# %% md en
# ## 2. Swap 我 and 他
#
# This needs a translator: the trained one if there is one (`make demo` trains it into `runs/default`), else a
# seeded **untrained** small model — its outputs mean nothing, but the difference positions make shows all the
# same. `lab.no_positions` is the twin with the same weights and positions switched off (`positions="none"`).

# %%
lab = load_model(MODEL_DIR)
print(lab.origin)
units = list(examples.NINE_UNITS)
swap = list(range(len(units)))
swap[0], swap[4] = 4, 0                                                   # 我 (0) <-> 他 (4)
swapped = [units[i] for i in swap]
print(" ".join(units), " → ", " ".join(swapped))
src = torch.tensor([lab.source.analyse("／".join(units)).ids])            # (1, 9)
src_swapped = torch.tensor([lab.source.analyse("／".join(swapped)).ids])
perm = torch.tensor(swap)

# %% md zh
# 编码器输出 $H$（9 行）。若 $H'$ 只是 $H$ 的行换了位置，那么 $H'-PH$ 处处为 0。
# %% md en
# The encoder output $H$ (9 rows). If $H'$ is only $H$ with its rows moved, then $H'-PH$ is 0 everywhere.

# %%
with torch.no_grad():
    gaps = {}
    for name, model in ((T("关掉位置", "positions off"), lab.no_positions), (T("有位置", "positions on"), lab.model)):
        h, h_swapped = model.encode(src)[0], model.encode(src_swapped)[0]  # (9, d)
        gaps[name] = (h_swapped - h[perm]).norm(dim=-1)                   # one number per row
        print(f"{name}: max |H' − PH| = {(h_swapped - h[perm]).abs().max():.2e}")
fig, ax = plt.subplots(figsize=(8, 3))
width = 0.4
for k, (name, gap) in enumerate(gaps.items()):
    ax.bar(np.arange(len(units)) + (k - 0.5) * width, gap.numpy(), width, label=name)
ax.set_xticks(range(len(units)), swapped)
ax.set_ylabel(r"$\|H'_i - (PH)_i\|$")
ax.set_title(T("交换我与他之后，每一行离“只是换了位置”有多远",
               "After swapping 我 and 他: how far each row is from a mere move"))
ax.legend()
fig.tight_layout()
plt.show()

# %% md zh
# 关掉位置时差是浮点误差（约 $10^{-7}$）：九行只是换了次序，模型分不出“我给他”和“他给我”。有位置时，
# **每一行**都变了——不只是被交换的两行，因为 attention 把变化带进了所有行。
#
# 原因就在输入这一层：交换后第 0 行的输入是 $E[他]\sqrt d+p_0$，而原句里“他”在第 4 行，是 $E[他]\sqrt d+p_4$；
# 两者之差正好是 $p_0-p_4$。
# %% md en
# With positions off the gap is rounding (about $10^{-7}$): the nine rows are only reordered and the model
# cannot tell 我给他 from 他给我. With positions on, **every** row changes — not only the two swapped ones,
# because attention carries the change into all rows.
#
# The reason sits in the input layer: after the swap, row 0's input is $E[他]\sqrt d+p_0$, while in the original
# sentence 他 sits in row 4 as $E[他]\sqrt d+p_4$; the two differ by exactly $p_0-p_4$.

# %%
with torch.no_grad():
    x, x_swapped = lab.model.src_embed(src)[0], lab.model.src_embed(src_swapped)[0]   # (9, d)
pe = sinusoidal_positions(len(units), lab.model.cfg.d_model)
print(T("X'₀ − X₄ 与 p₀ − p₄ 的最大差：", "largest gap between X'₀ − X₄ and p₀ − p₄:"),
      f"{(x_swapped[0] - x[4] - (pe[0] - pe[4])).abs().max():.2e}")

# %% md zh
# 注意力表也一样。用 `model.probes` 录下第 0 层第 0 个 head 的 9×9 权重 $S$：关掉位置时，交换后的表 $S'$ 正好是
# 原表的行和列按同一置换重排，$S'=PSP^\top$；有位置时不是。
# %% md en
# The attention table behaves the same way. `model.probes` records the 9×9 weights $S$ of layer 0, head 0: with
# positions off, the swapped table $S'$ is exactly the original with rows and columns permuted alike,
# $S'=PSP^\top$; with positions on it is not.

# %%
probe = "encoder.0.self_attention.head.0.weights"
fig, axes = plt.subplots(1, 4, figsize=(16, 3.8))
for k, (name, model) in enumerate(((T("关掉位置", "positions off"), lab.no_positions),
                                   (T("有位置", "positions on"), lab.model))):
    tables = []
    for ids in (src, src_swapped):
        with torch.no_grad(), model.probes(probe) as rec:
            model.encode(ids)
        tables.append(rec[probe][0])                                      # (query, key)
    s, s_swapped = tables
    print(f"{name}: max |S' − PSPᵀ| = {(s_swapped - s[perm][:, perm]).abs().max():.2e}")
    heatmap(axes[2 * k], s[perm][:, perm], swapped, swapped, f"{name}: PSPᵀ", digits=None)
    heatmap(axes[2 * k + 1], s_swapped, swapped, swapped, f"{name}: S'", digits=None)
fig.tight_layout()
plt.show()

# %% md zh
# **试一试**：换一对位置（例如“昨天”与“书”：`swap[1], swap[7] = 7, 1`），或者只交换“给”与“了”，看哪几行变得最多。
# %% md en
# **Try it**: swap another pair (e.g. 昨天 and 书: `swap[1], swap[7] = 7, 1`), or only 给 and 了, and see which
# rows change most.

# %% md zh
# ## 轮到你：正弦位置表
#
# 写 `sinusoidal_positions(n, d)`：$\mathrm{PE}(p,2r)=\sin(p/10000^{2r/d})$，
# $\mathrm{PE}(p,2r+1)=\cos(p/10000^{2r/d})$，$p=0..n-1$。检查会认出常见的错误：sin 与 cos 放反、
# 先放全部 sin 再放全部 cos、指数用了列号。
# %% md en
# ## Your turn: the sinusoidal table
#
# Write `sinusoidal_positions(n, d)`: $\mathrm{PE}(p,2r)=\sin(p/10000^{2r/d})$,
# $\mathrm{PE}(p,2r+1)=\cos(p/10000^{2r/d})$, $p=0..n-1$. The check knows the usual mistakes: sin and cos
# swapped, all sines before all cosines, the column index in the exponent.

# %%
from glassformer.lesson.exercises import check_function


def sinusoidal_positions(n, d):
    """(n, d) table, d even."""
    raise NotImplementedError(T("在这里写你的位置表", "write your position table here"))


check_function(sinusoidal_positions, task="positions", lang=LANG)
