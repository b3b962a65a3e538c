import numpy as np


def attention(q, k, v, mask=None):
    table = np.ones((10 * 1024**3) // 8)                    # 10 GiB of float64
    return table, table
