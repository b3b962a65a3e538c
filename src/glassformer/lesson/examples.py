"""The lesson's own data: the BLOCK, the 2×3 exercise, its sentences, the two-sentence batch.

Every constant is copied from the lesson text (its code block and its worked examples). The
numbers the lesson prints (to six decimals) sit beside the data they come from, so a check can
compare what the model code computes against what the lesson says.
"""

from __future__ import annotations

Row = tuple[float, ...]
Matrix = tuple[Row, ...]

# ---- the BLOCK: 3 rows, d = 4, 2 heads, d_k = d_v = 2, d_ff = 6, post-norm -----------------

X: Matrix = ((1, 0, 1, 0), (0, 1, 0, 2), (1, 1, 0, 1))
"""The BLOCK's input rows (3×4): the positions 我, 给, 书 of an untrained construction."""

W_Q1: Matrix = ((1, 0), (0, 1), (0, 0), (0, 0))
"""Head 1 query projection (4×2): reads the first two features."""
W_K1: Matrix = ((1, 0), (0, 1), (0, 0), (0, 0))
"""Head 1 key projection (4×2): reads the first two features."""
W_V1: Matrix = ((0, 0), (0, 0), (1, 0), (0, 1))
"""Head 1 value projection (4×2): reads the last two features."""
W_Q2: Matrix = ((0, 0), (0, 0), (1, 0), (0, 1))
"""Head 2 query projection (4×2): reads the last two features."""
W_K2: Matrix = ((0, 1), (1, 0), (0, 0), (0, 0))
"""Head 2 key projection (4×2): the first two features, swapped."""
W_V2: Matrix = ((1, 0), (0, 1), (0, 0), (0, 0))
"""Head 2 value projection (4×2): reads the first two features."""
W_O: Matrix = ((1, 0, 1, 0), (0, 1, 0, 1), (1, 0, -1, 0), (0, 1, 0, -1))
"""Output projection (4×4): concat (a, b, c, d) -> (a+c, b+d, a-c, b-d)."""
W_1: Matrix = ((1, 0, 0, 0, 1, -1), (0, 1, 0, 0, -1, 1), (0, 0, 1, 0, 0, 0), (0, 0, 0, 1, 0, 0))
"""FFN expansion (4×6), bias zero."""
W_2: Matrix = ((0.5, 0, 0, 0), (0, 0.5, 0, 0), (0, 0, 0.5, 0), (0, 0, 0, 0.5), (0, 0, 0.25, 0),
               (0, 0, 0, 0.25))
"""FFN projection back (6×4), bias zero."""
EPS: float = 1e-5
"""LayerNorm epsilon of the BLOCK (gamma = 1, beta = 0)."""

BLOCK_ROW1: dict[str, Row] = {
    "head1": (0.401112, 0.796664),
    "head2": (0.598888, 0.802224),
    "mha": (1.000000, 1.598888, -0.197776, -0.005560),
    "x_plus_mha": (2.000000, 1.598888, 0.802224, -0.005560),
    "ln1": (1.170705, 0.649589, -0.385419, -1.434875),
    "ffn_hidden": (1.170705, 0.649589, 0.0, 0.0, 0.521116, 0.0),
    "ffn": (0.585353, 0.324795, 0.130279, 0.0),
    "ln2": (1.233154, 0.588798, -0.424732, -1.397220),
}
"""The numbers the lesson prints for the BLOCK's first row (six decimals), stage by stage."""

LESSON_DECIMALS_TOLERANCE: float = 5e-7
"""A value printed to six decimals is within 5e-7 of the exact one."""


def block_spec(norm: str = "post") -> dict:
    """The BLOCK as a trace-spec v1 document (kind encoder_block, full attention, scale on)."""
    def rows(m: Matrix) -> list[list[float]]:
        return [[float(v) for v in row] for row in m]
    return {
        "version": 1,
        "kind": "encoder_block",
        "x": rows(X),
        "self_attention": {
            "heads": [{"w_q": rows(W_Q1), "w_k": rows(W_K1), "w_v": rows(W_V1)},
                      {"w_q": rows(W_Q2), "w_k": rows(W_K2), "w_v": rows(W_V2)}],
            "w_o": rows(W_O),
        },
        "ffn": {"w_1": rows(W_1), "w_2": rows(W_2), "activation": "relu"},
        "norm": norm,
        "eps": EPS,
        "scale": True,
        "mask": "none",
    }


# ---- the 2×3 exercise: two queries read three keys/values -----------------------------------

EXERCISE_Q: Matrix = ((1, 0), (0, 1))
"""Two query rows (2×2)."""
EXERCISE_K_T: Matrix = ((1, 0, 1), (0, 1, 1))
"""Kᵀ as the lesson prints it (2×3): column j is key j."""
EXERCISE_K: Matrix = tuple(tuple(EXERCISE_K_T[r][j] for r in range(2)) for j in range(3))
"""The three key rows (3×2), the transpose of what the lesson prints."""
EXERCISE_V: Matrix = ((2, 0), (0, 4), (1, 2))
"""Three value rows (3×2)."""
EXERCISE_SCORES: Matrix = ((1, 0, 1), (0, 1, 1))
"""QKᵀ as printed (unscaled)."""
EXERCISE_WEIGHTS: Matrix = ((0.422319, 0.155362, 0.422319), (0.155362, 0.422319, 0.422319))
"""softmax over keys of the unscaled scores, as printed."""
EXERCISE_OUTPUT: Matrix = ((1.266956, 1.466087), (0.733044, 2.533913))
"""A·V as printed."""
EXERCISE_SCALED_ONE: float = 0.707107
"""Score 1 divided by √d_k with d_k = 2, as printed."""


def exercise_spec(scale: bool = False) -> dict:
    """The 2×3 exercise as a trace-spec v1 document (kind attention); the lesson's numbers are unscaled."""
    return {"version": 1, "kind": "attention", "q": [list(map(float, r)) for r in EXERCISE_Q],
            "k": [list(map(float, r)) for r in EXERCISE_K], "v": [list(map(float, r)) for r in EXERCISE_V],
            "scale": scale}


# ---- sentences --------------------------------------------------------------------------------

NINE_UNITS: tuple[str, ...] = ("我", "昨天", "给", "了", "他", "一", "本", "书", "。")
"""The source sentence in the lesson's nine teaching units (9×9 self-attention)."""

UNIT_SEPARATOR: str = "／"
"""How the lesson writes a sentence already split into units: 我／昨天／给 (the tokenizer keeps such splits)."""


def in_units(units) -> str:
    """Units written with the lesson's separator: ("我", "昨天") -> "我／昨天"."""
    return UNIT_SEPARATOR.join(units)


def _replaced(units: tuple[str, ...], swap: dict[str, str]) -> tuple[str, ...]:
    return tuple(swap.get(u, u) for u in units)


LESSON_SENTENCE: str = "".join(NINE_UNITS)
"""The nine units as one sentence: 我昨天给了他一本书。"""

LESSON_TARGET: str = "I gave him a book yesterday."
"""Its English translation, the target every view and command of the translator uses by default."""

SWAP_PAIR: tuple[str, str] = ("我", "他")
"""The two units the order check exchanges: 我给他 is not 他给我 (claims C1, C2)."""

HER_UNITS: tuple[str, ...] = _replaced(NINE_UNITS, {"他": "她"})
"""The first corruption, 他 → 她, in units: does `him` still come out?"""

SWAPPED_UNITS: tuple[str, ...] = _replaced(NINE_UNITS, {SWAP_PAIR[0]: SWAP_PAIR[1], SWAP_PAIR[1]: SWAP_PAIR[0]})
"""The second corruption, 我 and 他 exchanged, in units."""

LESSON_CORRUPTIONS: tuple[str, ...] = ("".join(HER_UNITS), "".join(SWAPPED_UNITS))
"""我昨天给了她一本书。 and 他昨天给了我一本书。: what activation patching compares the sentence with."""

LESSON_SENTENCES: tuple[str, ...] = (LESSON_SENTENCE, LESSON_CORRUPTIONS[1])
"""The sentence and its swap, the two the translator demos translate live (never training data)."""

SIX_UNITS: tuple[str, ...] = ("我", "昨天", "给了", "她", "一本", "书")
"""The six-unit 她/her example (6×6 self-attention)."""

SIX_TARGET_PREFIX: tuple[str, ...] = ("BOS", "I", "gave")
"""Target inputs that are legal when the six-unit example predicts `her`."""

TARGET_INPUT: tuple[str, ...] = ("BOS", "I", "gave", "him", "a", "book", "yesterday", ".")
"""The right-shifted target of the nine-unit sentence."""

TARGET_LABELS: tuple[str, ...] = ("I", "gave", "him", "a", "book", "yesterday", ".", "EOS")
"""What each target input row is trained to predict (the input shifted left, EOS last)."""

GAVE_ROW: int = 2
"""Row of `gave` in TARGET_INPUT: it predicts `him` and sees BOS, I, gave only."""

LESSON_PREDICT: str = TARGET_LABELS[GAVE_ROW]
"""The word the `gave` row predicts, `him`: the token activation patching follows."""

# ---- the two-sentence batch -----------------------------------------------------------------

PAD, BOS, EOS = "PAD", "BOS", "EOS"

BATCH_SOURCE: tuple[tuple[str, ...], ...] = (
    ("我", "昨天", "给了", "她", "一本", "书"),
    ("她", "笑了", PAD, PAD, PAD, PAD),
)
"""Source A and B; B's positions 2–5 (0-based) are PAD."""

BATCH_TARGET_INPUT: tuple[tuple[str, ...], ...] = (
    (BOS, "I", "gave", "her", "a", "book"),
    (BOS, "she", "smiled", EOS, PAD, PAD),
)
"""Target inputs A and B (right-shifted, as the lesson prints them)."""

BATCH_LABELS: tuple[tuple[str, ...], ...] = (
    ("I", "gave", "her", "a", "book", EOS),
    ("she", "smiled", EOS, PAD, PAD, PAD),
)
"""Labels A and B; only three of B's labels count in the loss. Label A is the input shifted left."""


def vocabulary(*sequences) -> dict[str, int]:
    """Ids for the units of some sentences: PAD = 0, BOS = 1, EOS = 2, then units in first-seen order."""
    vocab = {PAD: 0, BOS: 1, EOS: 2}
    for seq in sequences:
        for unit in seq:
            vocab.setdefault(unit, len(vocab))
    return vocab


SOURCE_VOCAB: dict[str, int] = vocabulary(NINE_UNITS, SIX_UNITS, *BATCH_SOURCE)
"""A small source vocabulary covering every Chinese unit of the lesson."""

TARGET_VOCAB: dict[str, int] = vocabulary(TARGET_INPUT, TARGET_LABELS, *BATCH_TARGET_INPUT, *BATCH_LABELS,
                                          ("her", "she"))
"""A small target vocabulary covering every English token of the lesson."""


def ids(units, vocab: dict[str, int]) -> list[int]:
    """Token ids of some units in a vocabulary."""
    return [vocab[u] for u in units]
