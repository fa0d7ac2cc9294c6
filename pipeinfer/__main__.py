"""`python -m pipeinfer`: the `pipeinfer` command (the front launches jobs this way when the
console script is not beside its Python)."""

from .cli import main

if __name__ == "__main__":
    main()
