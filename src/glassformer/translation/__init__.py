"""Chinese→English translator: corpus loading (``corpus``) and tokenizers (``tokenize``)."""
