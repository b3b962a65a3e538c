"""The Chinese→English translator: corpus, tokenize, batching, train, checkpoint, decode, evaluate, explain."""
