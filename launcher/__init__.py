"""Chief-node side of csrun: the user API, the CLIs and the compiler."""
