import numpy as np


def helper(a):
    return np.linalg.inv(np.zeros((a.shape[1], a.shape[1])))


def attention(q, k, v, mask=None):
    return helper(q), None
