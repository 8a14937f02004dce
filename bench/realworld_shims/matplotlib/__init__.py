"""Stand-in for matplotlib (see ../README.md): pyplot calls do nothing, savefig writes an empty file."""


def use(backend, **kwargs):
    pass
