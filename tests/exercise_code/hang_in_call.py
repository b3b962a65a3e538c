def attention(q, k, v, mask=None):
    while True:
        pass
