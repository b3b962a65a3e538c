import sys


def attention(q, k, v, mask=None):
    sys.exit(3)
