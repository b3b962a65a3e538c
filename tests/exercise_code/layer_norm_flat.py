import numpy as np


def layer_norm(x, gamma, beta, eps):
    mu = x.mean(axis=1, keepdims=True)
    var = x.var(axis=1, keepdims=True)
    return (gamma * (x - mu) / np.sqrt(var + eps) + beta).ravel()
