def _nothing(*args, **kwargs):
    return None


figure = title = xlabel = ylabel = xticks = yticks = plot = close = _nothing


def savefig(fname, *args, **kwargs):
    open(fname, "wb").close()
