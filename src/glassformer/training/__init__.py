"""training: how a translator is made — settings (one schema) and presets, the data a recipe prepares, the
loop (Noam schedule, label-smoothed loss, checkpoints, DDP under torchrun) and the `train` command.

May import: decoding (the score after each epoch), data, inference, model, and the base modules. Never
interpret, interop, lab."""
