"""Benchmarks: glassformer beside torch.nn.Transformer and Hugging Face Marian, on the same work."""
