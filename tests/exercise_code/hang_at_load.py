while True:
    pass


def attention(q, k, v, mask=None):
    return None
