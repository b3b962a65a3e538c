import math

import numpy as np

BUGS = set()


def sinusoidal_positions(n, d):
    table = np.zeros((n, d))
    for p in range(n):
        for j in range(d):
            r2 = j - j % 2                               # 2r of the pair (2r, 2r + 1)
            if "positions-frequency" in BUGS:            # the column index in the exponent
                r2 = j
            elif "positions-frequency+" in BUGS:         # 2i with i the column index: the 2 counted twice
                r2 = 2 * j
            angle = p / 10000 ** (r2 / d)
            even = j % 2 == 0
            if "positions-sin-cos-swapped" in BUGS:
                even = not even
            table[p, j] = math.sin(angle) if even else math.cos(angle)
    if "positions-halves" in BUGS:                       # all the sines, then all the cosines
        table = np.concatenate([table[:, 0::2], table[:, 1::2]], axis=1)
    return table
