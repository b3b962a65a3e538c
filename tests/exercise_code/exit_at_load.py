import sys

sys.exit("bye")


def attention(q, k, v, mask=None):
    return None
