OUTSIDE = "PATH"


def attention(q, k, v, mask=None):
    with open("inside.txt", "w") as f:                   # its own folder: allowed
        f.write("mine")
    with open(OUTSIDE, "w") as f:
        f.write("escaped")
    return None
