# %% md zh
# # 第一章　2×3 练习与一个完整 block
#
# 这一章只用课文自己的数字：先是两个 query 读三个 key/value 的 2×3 矩阵轴练习，再是三行、两个 head 的 BLOCK。
# 两者都写成 **trace spec**（`glassformer.lesson.examples` 里的 `exercise_spec()`、`block_spec()`），
# 交给 `run_spec` 用模型自己的层以 float64 算一遍，返回每一个中间量。每个格子都可以改了再跑。
# %% md en
# # Chapter 1 — the 2×3 exercise and one complete block
#
# This chapter uses only the lesson's own numbers: first the 2×3 axis exercise (two queries read three
# keys/values), then the three-row, two-head BLOCK. Both are written as a **trace spec**
# (`exercise_spec()` and `block_spec()` in `glassformer.lesson.examples`) and handed to `run_spec`, which
# runs them through the model's own layers in float64 and returns every intermediate. Change any cell and
# run it again.

# %% setup

# %%
from glassformer.lesson import examples
from glassformer.lesson.spec import run_spec

# %% md zh
# ## 1. 2×3 练习：先不缩放
#
# 两个 query 行、三个 key/value 行。课文写出的是 $K^\top$（2×3），spec 里按行存 $K$（3×2）。
# 课文这一节的数字是**不缩放**的：$A=\operatorname{softmax}_{key}(QK^\top)$，$Y=AV$。
# %% md en
# ## 1. The 2×3 exercise, unscaled first
#
# Two query rows, three key/value rows. The lesson prints $K^\top$ (2×3); the spec stores $K$ row by row
# (3×2). The lesson's numbers here are **unscaled**: $A=\operatorname{softmax}_{key}(QK^\top)$, $Y=AV$.

# %%
spec = examples.exercise_spec(scale=False)
result = run_spec(spec)
print("Q =", spec["q"])
print("K =", spec["k"], " (Kᵀ =", [list(r) for r in examples.EXERCISE_K_T], ")")
print("V =", spec["v"])
print("QKᵀ =", result["scores"])
print("A =", np.round(result["weights"], 6))
print("AV =", np.round(result["output"], 6))
print(T("每行权重之和：", "row sums of A:"), np.sum(result["weights"], axis=1))

# %% md zh
# 与课文对照：$A$ 的第一行是 0.422319、0.155362、0.422319，输出是 (1.266956, 1.466087) 与 (0.733044, 2.533913)。
# softmax 沿 **key** 轴（每一行）归一化：每行之和是 1，列和不是。
# %% md en
# Compare with the lesson: the first row of $A$ is 0.422319, 0.155362, 0.422319, and the outputs are
# (1.266956, 1.466087) and (0.733044, 2.533913). Softmax normalises along the **key** axis (each row):
# every row sums to 1, the columns do not.

# %% md zh
# ## 2. 再除以 $\sqrt{d_k}$
#
# 同一组数，打开 `scale`：分数先除以 $\sqrt{d_k}=\sqrt2$，**然后**才做 softmax。1 变成 0.707107，
# 权重变得更平，输出也随之移动。下面一行六张小热图就是这条路：Q、K、V → $QK^\top$ → $\div\sqrt{d_k}$ →
# softmax 行 → 输出。
# %% md en
# ## 2. Now divide by $\sqrt{d_k}$
#
# Same numbers with `scale` on: the scores are divided by $\sqrt{d_k}=\sqrt2$ **before** the softmax.
# 1 becomes 0.707107, the weights flatten and the outputs move. The row of small heat maps below is that
# path: Q, K, V → $QK^\top$ → $\div\sqrt{d_k}$ → softmax rows → output.

# %% tag:picture
scaled = run_spec(examples.exercise_spec(scale=True))
queries, keys = ["q1", "q2"], ["k1", "k2", "k3"]
fig, axes = plt.subplots(1, 7, figsize=(15, 2.6))
heatmap(axes[0], spec["q"], queries, ["d1", "d2"], "Q", digits=0)
heatmap(axes[1], spec["k"], keys, ["d1", "d2"], "K", digits=0)
heatmap(axes[2], spec["v"], keys, ["d1", "d2"], "V", digits=0)
heatmap(axes[3], scaled["scores"], queries, keys, r"$QK^T$", digits=0)
heatmap(axes[4], scaled["scaled_scores"], queries, keys, r"$QK^T/\sqrt{d_k}$", digits=3)
heatmap(axes[5], scaled["weights"], queries, keys, T("softmax（每行和为 1）", "softmax (rows sum to 1)"), digits=3)
heatmap(axes[6], scaled["output"], queries, ["d1", "d2"], T("输出 AV", "output AV"), digits=3)
fig.suptitle(T("2×3 练习：两个 query 读三个 key/value", "The 2×3 exercise: two queries read three keys/values"))
fig.tight_layout()
plt.show()
print(T("缩放后的 1：", "the scaled 1:"), round(scaled["scaled_scores"][0][0], 6))
print(T("权重 0.422319 →", "weight 0.422319 →"), round(scaled["weights"][0][0], 6))

# %% md zh
# **试一试**：把 `scale=True` 改回 `False`，或者改 `spec["v"]` 里的一个数，再运行上面两个格子。
# %% md en
# **Try it**: set `scale=True` back to `False`, or change one number in `spec["v"]`, and rerun the two
# cells above.

# %% md zh
# ## 3. BLOCK：三行、两个 head、post-norm
#
# 三行代表“我、给、书”三个位置（未训练的构造）。第一头 Q/K 读前两维、V 读后两维；第二头 Q 读后两维、
# K 读交换次序的前两维、V 读前两维。$d=4$，$d_k=d_v=2$，$d_{ff}=6$，全 attention，无位置，无 dropout。
# %% md en
# ## 3. The BLOCK: three rows, two heads, post-norm
#
# The three rows stand for the positions 我, 给, 书 (an untrained construction). Head 1's Q/K read the first
# two features and its V the last two; head 2's Q reads the last two, its K the first two swapped, its V
# the first two. $d=4$, $d_k=d_v=2$, $d_{ff}=6$, full attention, no positions, no dropout.

# %%
tokens = ["我", "给", "书"]
block = examples.block_spec()
out = run_spec(block)
heads = out["self_attention"]["heads"]
keys6 = ["q", "k", "v", "scores", "scaled_scores", "weights", "output"]
titles = ["Q", "K", "V", r"$QK^T$", r"$\div\sqrt{d_k}$", "softmax", T("head 输出", "head output")]
fig, axes = plt.subplots(2, 7, figsize=(16, 4.6))
for h, head in enumerate(heads):
    for c, (key, title) in enumerate(zip(keys6, titles, strict=True)):
        cols = tokens if key in ("scores", "scaled_scores", "weights") else None
        heatmap(axes[h, c], head[key], tokens, cols, f"head {h + 1}: {title}")
fig.tight_layout()
plt.show()

# %% md zh
# 两个 head 读的是同一组三个位置，却因投影不同而有不同的权重和输出。接下来：同一位置拼接两头输出，
# 乘 $W^O$，加残差，LayerNorm（只在一行的 4 个特征上算），FFN（4→6→4，逐行），再加残差、LayerNorm。
# %% md en
# Both heads read the same three positions, yet their different projections give different weights and
# outputs. Next: concatenate the two heads' outputs at each position, multiply by $W^O$, add the residual,
# LayerNorm (over the 4 features of one row only), FFN (4→6→4, row by row), residual and LayerNorm again.

# %%
first, second = out["sublayers"]
stages = [("concat", out["self_attention"]["concat"]), (r"MHA = concat$\cdot W^O$", out["self_attention"]["output"]),
          ("X + MHA", first["residual"]), (r"$U = LN_1$", first["normed"]),
          (r"ReLU$(UW_1)$", out["ffn"]["hidden"]), ("FFN(U)", out["ffn"]["output"]),
          ("U + FFN", second["residual"]), (r"$Z = LN_2$", second["normed"])]
fig, axes = plt.subplots(1, len(stages), figsize=(17, 2.6))
for ax, (title, m) in zip(axes, stages, strict=True):
    heatmap(ax, m, tokens, None, title)
fig.tight_layout()
plt.show()

# %% md zh
# 课文逐步打印了第一行（“我”）的数字。下面把模型算出的第一行与课文的六位小数放在一起：差都在 $5\times10^{-7}$ 以内。
# %% md en
# The lesson prints the first row (我) stage by stage. Below, the model's first row sits next to the
# lesson's six decimals: every difference is within $5\times10^{-7}$.

# %%
model_row1 = {
    "head1": heads[0]["output"][0], "head2": heads[1]["output"][0], "mha": out["self_attention"]["output"][0],
    "x_plus_mha": first["residual"][0], "ln1": first["normed"][0], "ffn_hidden": out["ffn"]["hidden"][0],
    "ffn": out["ffn"]["output"][0], "ln2": out["output"][0],
}
for name, printed in examples.BLOCK_ROW1.items():
    gap = np.max(np.abs(np.array(model_row1[name]) - np.array(printed)))
    print(f"{name:11s} {T('课文', 'lesson')} {np.array(printed)}  {T('差', 'gap')} {gap:.1e}")

# %% md zh
# ## 4. 关掉一个 head
#
# trace spec 的 `disabled_heads` 去掉一个 head 的贡献（0 起数：`[1]` 关掉课文的第二头）：它照样计算，但 concat
# 里它的两列变成 0。第一头一点没变；$W^O$ 之后每个位置都少了第二头的贡献，后面的残差、LayerNorm、FFN 随之改变。
# %% md en
# ## 4. Switch a head off
#
# `disabled_heads` in the trace spec removes a head's contribution (0-based: `[1]` switches off the lesson's
# head 2): it is still computed, but its two columns of the concat become 0. Head 1 does not change at all;
# after $W^O$ every position lacks head 2's contribution, and the residual, LayerNorm and FFN after it change.

# %%
off = run_spec({**block, "disabled_heads": [1]})
pairs = [("concat", out["self_attention"]["concat"], off["self_attention"]["concat"]),
         ("MHA", out["self_attention"]["output"], off["self_attention"]["output"]),
         ("Z", out["output"], off["output"])]
fig, axes = plt.subplots(3, len(pairs), figsize=(10, 6.5))
for c, (name, before, after) in enumerate(pairs):
    heatmap(axes[0, c], before, tokens, None, T(f"{name}：两头都在", f"{name}: both heads"))
    heatmap(axes[1, c], after, tokens, None, T(f"{name}：关掉 head 2", f"{name}: head 2 off"))
    heatmap(axes[2, c], np.array(after) - np.array(before), tokens, None, T("变化", "change"), cmap="coolwarm")
fig.tight_layout()
plt.show()
print(T("head 1 输出的最大变化：", "largest change of head 1's output:"),
      np.max(np.abs(np.array(off["self_attention"]["heads"][0]["output"]) - np.array(heads[0]["output"]))))

# %% md zh
# ## 5. 移动 norm：post-norm 与 pre-norm
#
# 2017 年的写法是 post-norm：$U=\operatorname{LN}_1(X+\operatorname{MHA}(X))$。pre-norm 把 LayerNorm 移到子层
# **之前**：$U=X+\operatorname{MHA}(\operatorname{LN}_1(X))$，子层之后不再归一化。权重完全相同，只改 `norm`。
# post-norm 的每一行输出均值 0、标准差 1；pre-norm 的不是。
# %% md en
# ## 5. Move the norm: post-norm and pre-norm
#
# The 2017 form is post-norm: $U=\operatorname{LN}_1(X+\operatorname{MHA}(X))$. Pre-norm moves LayerNorm
# **before** the sub-layer: $U=X+\operatorname{MHA}(\operatorname{LN}_1(X))$, with no normalisation after it.
# Same weights, only `norm` changes. Every post-norm output row has mean 0 and standard deviation 1;
# the pre-norm rows do not.

# %%
pre = run_spec({**block, "norm": "pre"})
fig, axes = plt.subplots(1, 3, figsize=(11, 2.8))
heatmap(axes[0], out["output"], tokens, None, "post-norm Z")
heatmap(axes[1], pre["output"], tokens, None, "pre-norm Z")
heatmap(axes[2], np.array(pre["output"]) - np.array(out["output"]), tokens, None, T("变化", "change"),
        cmap="coolwarm")
fig.tight_layout()
plt.show()
for name, z in (("post", out["output"]), ("pre", pre["output"])):
    z = np.array(z)
    print(f"{name:4s} {T('行均值', 'row means')} {z.mean(axis=1)}  {T('行标准差', 'row std')} {z.std(axis=1)}")

# %% md zh
# **试一试**：把 `disabled_heads` 改成 `[0]`；或者给 `block["x"]` 换一行输入，看哪些格子变了、哪些没变
# （FFN 和 LayerNorm 逐行计算，只有 attention 会把别的行带进来）。
# %% md en
# **Try it**: set `disabled_heads` to `[0]`; or change one row of `block["x"]` and see which cells change and
# which do not (FFN and LayerNorm work row by row; only attention brings other rows in).

# %% md zh
# ## 6. 轮到你：自己写 attention 和 LayerNorm
#
# 下面这个 `attention` 有一个常见错误。运行 `check_function`：它在一组由种子决定的探针上运行你的函数
# （在另一个进程里，有时间和内存上限），与课文的计算逐个比较；不对时，说出这段代码犯的是错误库里的哪一个，
# 并给出能看出问题的最小输入。改好它，再运行一次，直到判定为“对”。然后在下一格写你自己的 LayerNorm。
# 同样的检查在命令行是 `glassformer exercise check-code 文件.py --task attention`
# （`glassformer exercise new --code all --out 文件夹` 写出每个任务的起始文件）。
# %% md en
# ## 6. Your turn: write attention and LayerNorm yourself
#
# The `attention` below has a classic mistake. Run `check_function`: it runs your function on probes drawn
# from a seed (in another process, with time and memory limits), compares each with the lesson's
# computation and, when they differ, names the mistake of the bug library your code makes, with the smallest
# input that shows it. Fix it and run it again until the verdict is right. Then write your own LayerNorm in
# the next cell. On the command line the same check is `glassformer exercise check-code FILE.py --task
# attention` (`glassformer exercise new --code all --out DIR` writes a starter file per task).

# %%
from glassformer.lesson.exercises import check_function


def attention(q, k, v, mask=None):
    """q (n, d_k), k (m, d_k), v (m, d_v); mask (n, m) bool, True = may attend. Returns (weights, output)."""
    scores = q @ k.T                                                      # (query, key)
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    top = np.max(scores, axis=1, keepdims=True)
    e = np.exp(scores - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(axis=1, keepdims=True)
    weights = np.divide(e, total, out=np.zeros_like(e), where=total > 0) / np.sqrt(q.shape[1])
    return weights, weights @ v


check_function(attention, task="attention", lang=LANG)

# %%
def layer_norm(x, gamma, beta, eps):
    """x (n, d); gamma, beta (d,). Each row over its own d features: γ ⊙ (x − μ) / √(σ² + ε) + β."""
    raise NotImplementedError(T("在这里写你的 LayerNorm", "write your LayerNorm here"))


check_function(layer_norm, task="layer-norm", lang=LANG)
