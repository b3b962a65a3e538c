"""The attribution methods' names, light to import: the commands build their options from them before torch loads
(`evaluate`'s helpers fork first: decoding/commands.py)."""

METHODS = ("saliency", "input-x-gradient", "integrated-gradients", "attention", "alti")
SHARE_METHODS = tuple(m for m in METHODS if m != "attention")   # attention has no source share
SHARE_STEPS = 32        # source shares' integrated gradients, trapezoid: the ranking of sentences, not 1 % completeness
