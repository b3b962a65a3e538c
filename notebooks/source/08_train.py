# %% md zh
# # 第八章　在页面里训练：看一个小 Transformer 学会反转
#
# 前面各章的权重都是训练好的。实验室的**训练**视图（`#train`）让学生亲眼看到训练本身：一个小的 encoder–decoder
# 从随机权重开始，在浏览器里学复制、反转、排序或一个课文大小的小语法（时间词移到句末，代词随角色变成 he / him）。
# 它用页面引擎自己的反向传播和 Adam（float64），在后台线程里运行，页面照常可用；同一个种子得到同样的训练过程。
# 打开方式：`glassformer lab` 之后点“⑧ 训练”，或者导出的离线文件 `glassformer lab --export lab.html`。
#
# 训练时的四幅图，每幅下面都写着它对应的课文句子：
#
# | 图 | 看到什么 | 课文 |
# |---|---|---|
# | 损失曲线 | 每一步这一批所有目标位置的交叉熵；蓝点是留出序列的准确率 | — |
# | 这一批的 teacher forcing | 右移后的输入（以 `<s>` 开头）、同一次前向里每个位置的预测、目标，对的绿、错的红 | “训练样本提供全部右移输入，各位置只读其合法前缀，因此同层位置可并行计算。”（D6） |
# | 留出例子的交叉注意力 | 目标行 × 源位置：开始时差不多平，慢慢形成对角线（复制）、反对角线（反转）、交叉的线（小语法） | “目标端同时通过cross-attention读取全部已知源句”，对应关系“需要从数据学习”（D2、D4） |
# | 生成 | 同一个例子的贪心输出，一步一个 token，旁边是一次算出的 teacher forcing 预测 | “生成时后续token尚未知，选出一个后才能追加并预测下一个。”（D6） |
#
# 第五章用 Python 量过同一件事：teacher forcing 一次算出的各行 logits，与一步一步、带 cache 算出的完全一样。
# %% md en
# # Chapter 8 — training in the page: watch a small Transformer learn to reverse
#
# Every earlier chapter used weights that arrived trained. The lab's **Train** view (`#train`) shows training
# itself: a small encoder–decoder starts from random weights and, in the browser, learns to copy, reverse, sort,
# or a lesson-sized toy grammar (the time word moves to the end, a pronoun becomes he / him by its role). It uses
# the page engine's own backward pass and Adam (float64) in a background worker, so the page stays usable; the
# same seed gives the same run. Open it with `glassformer lab` and the “⑧ Train” tab, or in the exported offline
# file, `glassformer lab --export lab.html`.
#
# Four pictures while it trains, each captioned with the lesson sentence it shows:
#
# | picture | what you see | the lesson |
# |---|---|---|
# | loss curve | each step's cross-entropy over every target position of the batch; blue dots: held-out accuracy | — |
# | this batch, teacher-forced | the right-shifted input (`<s>` first), every position's prediction from one forward pass, the target; right green, wrong red | “a training sample provides every right-shifted input; each position reads only its legal prefix, so the positions of a layer are computed in parallel” (D6) |
# | cross-attention of a held-out example | target row × source position: flat at first, then the diagonal (copy), the anti-diagonal (reverse), crossing lines (the grammar) | “the target side reads the whole known source through cross-attention”, the correspondence “has to be learnt from data” (D2, D4) |
# | generation | the same example's greedy output, one token a step, beside the teacher-forced prediction computed at once | “when generating, the later tokens are not known yet: one is chosen, appended, and only then is the next predicted” (D6) |
#
# Chapter 5 measured the same fact in Python: the logits teacher forcing computes for every row at once equal
# the ones decoding computes step by step with its cache.

# %% setup

# %%
from urllib.parse import quote

import torch

from glassformer.model import ModelConfig, Transformer

# %% md zh
# ## 1. 同一个实验，用 glassformer 的 PyTorch 模型
#
# 页面里的训练视图与下面这几行做的是同一件事（页面用它自己的 JavaScript 引擎）：反转 6–8 个符号的序列，
# d = 32，encoder、decoder 各一层，四个头；留出的 200 个序列从不参与训练。每一步是一批 teacher forcing：
# 解码器的输入是右移后的目标（BOS 在前），所有目标位置一次算出损失。先记下训练前一个留出例子的交叉注意力，
# 训练后再看一次。
# %% md en
# ## 1. The same experiment with glassformer's PyTorch model
#
# The page's Train view does what these lines do (the page with its own JavaScript engine): reverse sequences of
# 6–8 symbols, d = 32, one encoder and one decoder layer, four heads; 200 held-out sequences never take part in
# training. Each step is one teacher-forced batch: the decoder's input is the right-shifted target (BOS first),
# and every target position's loss is computed at once. The cross-attention of one held-out example is recorded
# before training, and again after.

# %%
SYMBOLS = list("abcdefghijkl")
VOCAB = ["<pad>", "<s>", "</s>", "<unk>", *SYMBOLS]                       # ids 0..3 are PAD, BOS, EOS, UNK
PAD, BOS, EOS = 0, 1, 2
torch.manual_seed(0)
draws = torch.Generator().manual_seed(0)


def draw(n):
    """n random sequences of 6-8 symbol ids."""
    return [torch.randint(len(VOCAB) - len(SYMBOLS), len(VOCAB), (int(k),), generator=draws).tolist()
            for k in torch.randint(6, 9, (n,), generator=draws)]


def reversal_batch(seqs):
    """source, decoder input (BOS + reversed), labels (reversed + EOS), PAD-filled: (batch, len) each."""
    width = max(map(len, seqs))
    src = torch.full((len(seqs), width), PAD)
    tgt_in = torch.full((len(seqs), width + 1), PAD)
    labels = torch.full((len(seqs), width + 1), PAD)
    for i, s in enumerate(seqs):
        src[i, : len(s)] = torch.tensor(s)
        tgt_in[i, : len(s) + 1] = torch.tensor([BOS, *s[::-1]])
        labels[i, : len(s) + 1] = torch.tensor([*s[::-1], EOS])
    return src, tgt_in, labels


held_out = draw(200)
seen = {tuple(s) for s in held_out}
cfg = ModelConfig(src_vocab=len(VOCAB), tgt_vocab=len(VOCAB), d_model=32, heads=4, d_ff=128, encoder_layers=1,
                  decoder_layers=1, dropout=0.0, max_len=32)
toy = Transformer(cfg)


def cross_attention(model, seq):
    """The last decoder layer's cross-attention of one sequence, mean over heads: (target, source)."""
    src, tgt_in, _ = reversal_batch([seq])
    with torch.no_grad(), model.probes("decoder.0.cross_attention.head.*.weights") as rec:
        model(src, tgt_in)
    return torch.stack([rec[name][0] for name in rec]).mean(0)[: len(seq)]


example = held_out[0]
before = cross_attention(toy.eval(), example)
optimizer = torch.optim.Adam(toy.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: min(1.0, (t + 1) / 100))
losses = []
toy.train()
for _ in range(400):
    src, tgt_in, labels = reversal_batch([s for s in draw(48) if tuple(s) not in seen][:32])
    total, count = toy.loss(src, tgt_in, labels)                         # every target position at once
    optimizer.zero_grad()
    (total / count).backward()
    torch.nn.utils.clip_grad_norm_(toy.parameters(), 1.0)
    optimizer.step()
    warmup.step()
    losses.append(total.item() / count)
toy.eval()
after = cross_attention(toy, example)
with torch.no_grad():
    src, tgt_in, labels = reversal_batch(held_out)
    right = ((toy(src, tgt_in).argmax(-1) == labels) | (labels == PAD)).all(-1)
print(T("留出集上每个位置都对的序列：", "held-out sequences right at every position:"), f"{right.float().mean():.1%}")

letters = [VOCAB[i] for i in example]
fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
axes[0].plot(losses, color="#d6452e")
axes[0].set_xlabel(T("训练步数", "training steps"))
axes[0].set_title(T("损失（这一批所有目标位置）", "loss (every target position of the batch)"), fontsize=10)
heatmap(axes[1], before, letters[::-1], letters, T("训练前的交叉注意力", "cross-attention before training"))
heatmap(axes[2], after, letters[::-1], letters, T("训练后：反对角线", "after training: the anti-diagonal"))
fig.tight_layout()
plt.show()
mirrored = sum(int(after[i].argmax()) == len(example) - 1 - i for i in range(len(example)))
print(T("最大权重落在镜像源位置的行：", "rows whose largest weight is on the mirrored source position:"),
      f"{mirrored} / {len(example)}")

# %% md zh
# ## 2. 给学生的链接
#
# 训练视图的整套设置都在网址 `#` 后面，所以老师可以把一个设置发成链接；`hide` 列出要隐藏的控件，学生就只能动剩下的。
# 下面把几组设置写成链接（把 `lab.html` 换成你导出的文件或 `glassformer lab` 打开的网址）。没写的设置取默认值。
# %% md en
# ## 2. Links for the students
#
# The Train view keeps its whole set-up in the address after `#`, so a teacher sends a configuration as a link;
# `hide` lists the controls to remove, and the students change only the rest. Below, a few set-ups as links
# (replace `lab.html` with your exported file or the address `glassformer lab` opens). Settings left out take
# their defaults.

# %%
LESSONS = {
    T("反转：看反对角线出现", "reverse: watch the anti-diagonal appear"):
        ({"task": "reverse", "seed": 3}, ["lr", "warmup", "seed"]),
    T("复制与反转对比：只能换任务", "copy against reverse: only the task changes"):
        ({"task": "copy", "seed": 3}, ["d_model", "encoder_layers", "decoder_layers", "heads", "d_ff", "lr", "warmup",
                                       "label_smoothing", "batch", "seed"]),
    T("没有位置编码还能反转吗", "can it reverse without positions?"):
        ({"task": "reverse", "positions": "none", "seed": 3}, ["lr", "warmup", "seed"]),
    T("小语法：时间词移动，代词变形", "the toy grammar: the time word moves, the pronoun changes"):
        ({"task": "grammar", "d_model": 32, "seed": 7}, ["seed"]),
}


def train_link(settings, hide, page="lab.html"):
    """The Train view's address for these settings, with the listed controls hidden."""
    query = "&".join(f"{key}={quote(str(value))}" for key, value in settings.items())
    return f"{page}#train?{query}" + (f"&hide={','.join(hide)}" if hide else "")


for title, (settings, hide) in LESSONS.items():
    print(f"{title}\n  {train_link(settings, hide)}")

# %% md zh
# 没有位置编码时（第三个链接），encoder 看到的是一个**集合**：第三章说过，交换两个源位置只会把输出跟着交换。
# 反转要知道“倒数第几个”，所以这个设置下留出集准确率上不去——学生自己就能看到位置编码为什么必要。
# %% md en
# Without positions (the third link) the encoder sees a **set**: as chapter 3 showed, swapping two source
# positions only swaps the outputs with them. Reversing needs to know “the i-th from the end”, so held-out
# accuracy stays low in this set-up — the students see for themselves why positions are needed.
