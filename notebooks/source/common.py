import warnings

import matplotlib.pyplot as plt
import numpy as np
from matplotlib import font_manager

from glassformer.paths import default_model_dir


def T(zh, en):
    """The text of the notebook's language."""
    return zh if LANG == "zh" else en


# A trained translator ($GLASSFORMER_MODEL, else runs/default, which `make demo` trains; the notebooks run two
# folders below the repository root); without it the seeded untrained model.
MODEL_DIR = default_model_dir("../..")

# Chinese labels need a CJK font: take the first one installed.
CJK_FONTS = ["Noto Sans CJK SC", "Source Han Sans SC", "WenQuanYi Micro Hei", "WenQuanYi Zen Hei", "SimHei",
             "Microsoft YaHei", "PingFang SC", "Heiti SC", "Arial Unicode MS"]
installed = {f.name for f in font_manager.fontManager.ttflist}
cjk = [name for name in CJK_FONTS if name in installed]
plt.rcParams["font.sans-serif"] = cjk + plt.rcParams["font.sans-serif"]
plt.rcParams["axes.unicode_minus"] = False
if not cjk:
    warnings.filterwarnings("ignore", message="Glyph .* missing from")
    print(T("没有找到中文字体，图里的汉字会显示成方框（例如装 fonts-noto-cjk 或 fonts-wqy-microhei）。",
            "No CJK font found: Chinese labels will show as boxes (install e.g. fonts-noto-cjk)."))
np.set_printoptions(precision=6, suppress=True)


def heatmap(ax, m, rows=None, cols=None, title="", digits=2, cmap="viridis", vmin=None, vmax=None):
    """A matrix as a heat map with its numbers written in (digits=None: no numbers); None / -inf (masked) cells
    stay blank."""
    if hasattr(m, "detach"):                                               # a torch tensor
        m = m.detach().double().cpu().numpy()
    a = np.array([[np.nan if v is None else v for v in row] for row in np.atleast_2d(np.asarray(m, dtype=object))],
                 dtype=float)
    if cmap == "coolwarm" and vmin is None and vmax is None:              # differences: white at 0
        vmax = float(np.nanmax(np.abs(a[np.isfinite(a)]), initial=0)) or 1.0
        vmin = -vmax
    image = ax.imshow(np.where(np.isfinite(a), a, np.nan), cmap=cmap, aspect="auto", vmin=vmin, vmax=vmax)
    for (i, j), v in np.ndenumerate(a if digits is not None else np.zeros((0, 0))):
        r, g, b, _ = image.cmap(image.norm(v)) if np.isfinite(v) else (1, 1, 1, 1)
        ax.text(j, i, f"{v:.{digits}f}" if np.isfinite(v) else "−∞", ha="center", va="center", fontsize=8,
                color="white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black")
    ax.set_xticks(range(a.shape[1]), cols if cols is not None else range(a.shape[1]))
    ax.set_yticks(range(a.shape[0]), rows if rows is not None else range(a.shape[0]))
    ax.set_title(title, fontsize=10)
    return ax
