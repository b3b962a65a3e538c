"""`python -m glassformer.train`: the training entry point torchrun can launch (same options as
`glassformer train`)."""

if __name__ == "__main__":
    from glassformer.training.commands import main

    main()
